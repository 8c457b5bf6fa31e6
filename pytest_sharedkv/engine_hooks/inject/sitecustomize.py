"""Loaded by launched processes whose PYTHONPATH starts with this directory: turns on
pytest-sharedkv's fault-sensitivity mode when SHAREDKV_INJECT_DELAY_CYCLES is set, and the
service tier's sensitivity gate when SHAREDKV_CORRUPT_CONTROL is set, and the in-engine KV
audit when SHAREDKV_KV_AUDIT_DIR is set."""

import os

if os.environ.get("SHAREDKV_INJECT_DELAY_CYCLES"):
    from pytest_sharedkv.engine_hooks.delay_hook import install

    install()

if os.environ.get("SHAREDKV_CORRUPT_CONTROL"):
    from pytest_sharedkv.engine_hooks.corrupt_hook import install as arm_gate

    arm_gate()

if os.environ.get("SHAREDKV_KV_AUDIT_DIR"):
    from pytest_sharedkv.engine_hooks.kv_audit_hook import install as audit_kv

    audit_kv()
