"""Loaded by launched processes whose PYTHONPATH starts with this directory: turns on
pytest-sharedkv's fault-sensitivity mode when SHAREDKV_INJECT_DELAY_CYCLES is set, and the
service tier's sensitivity gate when SHAREDKV_CORRUPT_CONTROL is set (in an in-process
LMCache replica, SHAREDKV_INPROCESS_GATE_CONTROL; in a replica on vLLM's native offload,
SHAREDKV_NATIVE_GATE_CONTROL, or SHAREDKV_SIMPLE_GATE_CONTROL on its
SimpleCPUOffloadConnector), the in-engine KV
audit when SHAREDKV_KV_AUDIT_DIR is set, the triage's synchronize around KV transfers
when SHAREDKV_SYNC_LOG is set, the fault catalogue's hook when SHAREDKV_FAULT_CONTROL is
set, and the triage's stream remedy for LMCache's fallback copy when SHAREDKV_STREAM_REMEDY
is set, and LMCache #4991's forced interleaving of two fs L2 writes when
SHAREDKV_WRITE_RACE_DIR is set."""

import os


def _see_the_plugin() -> None:
    """The hooks live in pytest_sharedkv. A launched process finds it where pytest found it
    (installed, or the checkout on sys.path), but not where pytest ran from a checkout's
    root (``python -m pytest_sharedkv``: found through the working directory, which a
    ``python -c`` child does not search at start-up): then the checkout goes on sys.path,
    last, so it shadows nothing."""
    import importlib.util
    import sys

    if importlib.util.find_spec("pytest_sharedkv") is None:
        here = os.path.dirname(os.path.realpath(__file__))  # pytest_sharedkv/engine_hooks/inject
        sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(here))))


_see_the_plugin()  # this directory is on a process's path only where a hook is asked for

if os.environ.get("SHAREDKV_INJECT_DELAY_CYCLES"):
    from pytest_sharedkv.engine_hooks.delay_hook import install

    install()

if os.environ.get("SHAREDKV_CORRUPT_CONTROL"):
    from pytest_sharedkv.engine_hooks.corrupt_hook import install as arm_gate

    arm_gate()

if os.environ.get("SHAREDKV_INPROCESS_GATE_CONTROL"):
    from pytest_sharedkv.engine_hooks.inprocess_gate_hook import install as arm_replica_gate

    arm_replica_gate()

if os.environ.get("SHAREDKV_NATIVE_GATE_CONTROL"):
    from pytest_sharedkv.engine_hooks.native_gate_hook import install as arm_native_gate

    arm_native_gate()

if os.environ.get("SHAREDKV_SIMPLE_GATE_CONTROL"):
    from pytest_sharedkv.engine_hooks.simple_gate_hook import install as arm_simple_gate

    arm_simple_gate()

if os.environ.get("SHAREDKV_KV_AUDIT_DIR"):
    from pytest_sharedkv.engine_hooks.kv_audit_hook import install as audit_kv

    audit_kv()

if os.environ.get("SHAREDKV_SYNC_LOG"):
    from pytest_sharedkv.engine_hooks.sync_hook import install as synchronize_transfers

    synchronize_transfers()

if os.environ.get("SHAREDKV_FAULT_CONTROL"):
    from pytest_sharedkv.engine_hooks.fault_hook import install as inject_faults

    inject_faults()

if os.environ.get("SHAREDKV_STREAM_REMEDY"):
    from pytest_sharedkv.engine_hooks.stream_remedy_hook import install as remedy_copies

    remedy_copies()

if os.environ.get("SHAREDKV_WRITE_RACE_DIR"):
    from pytest_sharedkv.engine_hooks.write_race_hook import install as race_l2_writes

    race_l2_writes()


def _load_the_next_sitecustomize() -> None:
    """This directory comes first on the launched process's PYTHONPATH, so it hides the
    sitecustomize Python would have imported (a coverage subprocess hook, a
    distribution's): load that one too, once, and never this file again."""
    import importlib.machinery
    import importlib.util
    import sys

    guard = "_sharedkv_next_sitecustomize"
    if guard in sys.modules:
        return
    mine = os.path.realpath(__file__)
    here = os.path.dirname(mine)
    rest = [p for p in sys.path if os.path.realpath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or (
            spec.origin is not None and os.path.realpath(spec.origin) == mine):
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[guard] = module
    spec.loader.exec_module(module)


_load_the_next_sitecustomize()
