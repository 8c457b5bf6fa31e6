"""``--sharedkv-stack inprocess|native`` as a launched pair: the launch spec the MP stack
would run, turned into one for LMCache's in-process connector (``inprocess_connector.py``:
no MP server, ``LMCacheConnectorV1`` in each replica, a Redis the suite starts as the
shared remote backend) or vLLM's own CPU offload (``native_offload.py``: the NATIVE arm's
flags, the GPU cache sized in blocks so the corpus is served from the CPU tier, through
the connector ``--sharedkv-native-connector`` chooses). The launch record names the stack
and its connector (``LaunchRecord.stack``); the stub double models a stack as it models
the MP server (a shared pool, or one pool each) and its record says so."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pytest_sharedkv.config.stack_choice import (
    CONNECTOR_CLASSES,
    INPROCESS,
    NATIVE,
    OFFLOADING,
    SIMPLE,
    NativeConnector,
    Stack,
)
from pytest_sharedkv.stack.launch.inprocess_connector import NO_AUDIT as INPROCESS_NO_AUDIT
from pytest_sharedkv.stack.launch.spec import PlannedRedis, StackLaunch, StackUnavailable
from pytest_sharedkv.stack.pair import ReplicaPair

if TYPE_CHECKING:
    from pytest_sharedkv.config.options import Settings
    from pytest_sharedkv.corpus.cases import CaseSet
    from pytest_sharedkv.stack.launch.spec import LaunchSpec

STUB_CONNECTOR = "stub (test double)"  # how compare reads a stub's record: no KV stack
# the LaunchSpec arm each stack launches on: no MP server (the stack's flags give the
# connector), or the NATIVE arm (vLLM's OffloadingConnector)
ARMS = {INPROCESS: "OFF", NATIVE: "NATIVE"}
STUB_ARMS = {INPROCESS: "ON", NATIVE: "NATIVE"}  # one shared pool, or one pool each
# how the sensitivity gate reaches vLLM's native offload: B's own CPU tier serves B's
# second pass over the controls, and a hook in B's vLLM zeroes the named chunk's GPU blocks
# as that load lands (engine_hooks/native_gate_hook.py; simple_gate_hook.py for the
# SimpleCPUOffloadConnector)
NATIVE_GATE = "replica B's vLLM CPU-tier loads (native_gate_hook)"
SIMPLE_GATE = "replica B's vLLM CPU-tier loads (simple_gate_hook)"


INPROCESS_NO_REMOTE = (
    "--sharedkv-inprocess-remote none: the replicas share no remote backend (each LMCache's "
    "tiers serve only its own replica), so B's cross-replica requests retrieve nothing of "
    "A's and the gate, which zeroes a chunk in B's retrieves, has nothing to corrupt")


@dataclass(frozen=True)
class InprocessTiers:
    """The in-process stack's tiers per replica, as the options give them: CPU (GiB; None:
    the pool's size), disk (GiB; None: no disk tier), whether a remote is shared, and
    whether vLLM's own GPU prefix cache runs beside them."""

    cpu_gib: float | None = None
    disk_gib: float | None = None
    remote: bool = True
    prefix_caching: bool = True


def inprocess_tiers(settings: Settings) -> InprocessTiers:
    return InprocessTiers(settings.inprocess_cpu_gib, settings.inprocess_disk_gib,
                          settings.inprocess_remote != "none",
                          settings.inprocess_prefix_caching)


def inprocess_problem(settings: Settings) -> str | None:
    """Why ``--sharedkv-stack inprocess`` cannot start the Redis its replicas share
    (``--sharedkv-inprocess-remote redis``, the default) here: no redis-server, or no Python
    client to see it answer (redis_server.missing); None where nothing is missing or no
    Redis is started. Said before any test, as ``stacked_spec`` would at the start."""
    from pytest_sharedkv.stack.l2.redis_server import missing

    if not inprocess_tiers(settings).remote:
        return None
    why = missing()
    if why is None:
        return None
    remote = settings.source_of("inprocess_remote")
    return (f"{settings.source_of('stack')} inprocess shares KV through a Redis the suite "
            f"starts ({remote} {settings.inprocess_remote}): {why}; or give {remote} none, "
            "which shares nothing between the replicas")


def group_tokens(cases: CaseSet) -> int:
    """The prompt tokens of the smallest size group the run sends (the one most likely to
    stay on the GPU between its cold and its local step)."""
    groups: dict[str, int] = {}
    for case in cases.cases:
        groups[case.size] = groups.get(case.size, 0) + (case.prompt_tokens or 0)
    return min(groups.values(), default=0)


def inprocess_stack(spec: LaunchSpec, config: Mapping[str, Any], remote_url: str | None,
                    backend: PlannedRedis | None = None,
                    tiers: InprocessTiers = InprocessTiers()) -> StackLaunch:
    """The in-process connector over REMOTE_URL (None: no remote), each replica's tiers as
    TIERS size them (CPU: the pool's size, ``spec.l1_size_gb``, unless given; a disk
    directory each under the run's log directory), the chunk the MP stack would use; where
    SPEC asks for the sensitivity gate and a remote is shared, B's LMCache zeroes the named
    chunks (``inprocess_gate_hook``); TIERS without prefix caching add
    ``--no-enable-prefix-caching`` to both replicas and say so in the record.
    StackUnavailable names the option of a tier that cannot run."""
    from pytest_sharedkv.layouts.chunk_size import engine_block_size
    from pytest_sharedkv.stack.launch.inprocess_connector import (
        InprocessConfigError,
        InprocessSettings,
        inprocess_launch,
    )

    options = {"local_cpu_gb": "--sharedkv-inprocess-cpu-gib",
               "local_disk_gb": "--sharedkv-inprocess-disk-gib",
               "local_disk": "--sharedkv-inprocess-disk-gib"}
    disk = tiers.disk_gib is not None
    try:
        launch = inprocess_launch(
            InprocessSettings(chunk_size=spec.chunk_size,
                              local_cpu_gb=tiers.cpu_gib or spec.l1_size_gb,
                              local_disk=spec.log_dir / "lmcache-disk" if disk else None,
                              local_disk_gb=tiers.disk_gib or 0.0, remote_url=remote_url,
                              prefix_caching=tiers.prefix_caching,
                              engine_block=engine_block_size(config)),
            spec.log_dir / "lmcache-config")
    except InprocessConfigError as exc:
        where = options.get(exc.field, "--sharedkv-stack inprocess")
        raise StackUnavailable(f"{where}: {exc}") from None
    envs = {r.name: r.env for r in launch.replicas}
    gate = None
    if spec.gate and remote_url is not None:
        from pytest_sharedkv.engine_hooks import inprocess_gate_hook as hook
        from pytest_sharedkv.stack.launch.spec import gate_paths

        gate = gate_paths(spec.log_dir)
        envs["B"] = tuple(sorted({**dict(envs["B"]), hook.CONTROL_ENV: str(gate[0]),
                                  hook.LOG_ENV: str(gate[1]),
                                  hook.CHUNK_ENV: str(spec.chunk_size)}.items()))
    return StackLaunch(
        INPROCESS, ARMS[INPROCESS], tuple(launch.argv()), tuple(envs.items()),
        {**launch.record(), "stack": INPROCESS, "kv_audit": f"n/a: {INPROCESS_NO_AUDIT}", **(
            {"gate": "replica B's LMCache (inprocess_gate_hook)"} if gate is not None
            else {"gate": "off"} if remote_url is not None
            else {"gate": "none", "no_gate": INPROCESS_NO_REMOTE})},
        description=f"vllm x2, LMCache in-process ({launch.backend})",
        allocator=f"in-process ({launch.backend})", backend=backend, inprocess=launch,
        gate=gate)


def native_stack(spec: LaunchSpec, config: Mapping[str, Any], cases: CaseSet,
                 concurrency: int, connector: NativeConnector | str = OFFLOADING
                 ) -> StackLaunch:
    """vLLM's native offload for the corpus: the GPU cache (blocks) too small to keep the
    smallest size group, a CPU tier that holds it, the first ``mamba_cache_mode`` vLLM
    runs for the model, through CONNECTOR (``offloading`` or ``simple``: both replicas
    run it, and B's gate hook is the one written for it). StackUnavailable where the group
    would fit on the GPU anyway."""
    from pytest_sharedkv.layouts.chunk_size import engine_block_size
    from pytest_sharedkv.stack.launch.native_offload import (
        NativeOffloadError,
        NativeOffloadPlan,
        attention_bytes_per_token,
        cpu_gb,
        gpu_blocks,
        mamba_cache_modes,
    )

    block = engine_block_size(config)
    longest = max((c.prompt_tokens or 0 for c in cases.cases), default=0)
    tokens = group_tokens(cases)
    try:
        blocks = gpu_blocks(tokens, longest, cases.answer_tokens, concurrency, block,
                            spec.max_model_len)
        per_token = attention_bytes_per_token(config)
    except NativeOffloadError as exc:
        if exc.field != "model":
            raise StackUnavailable(f"--sharedkv-stack native: {exc}") from None
        per_token = None  # a hybrid's padded pages: the CPU tier is the pool's size
    tier = cpu_gb(tokens, per_token) if per_token else spec.l1_size_gb
    modes = mamba_cache_modes(config)
    connector = NativeConnector(connector)
    simple = connector is SIMPLE
    plan = NativeOffloadPlan(tier, blocks, block, modes[0] if modes else None,
                             simple_connector=simple, bytes_per_token=per_token)
    extra = native_extra(plan.argv())
    envs = {name: dict(plan.env()) for name in ("A", "B")}  # the connector: both replicas
    gate = None
    if spec.gate:  # B's hook, as the in-process stack arms B's LMCache
        from pytest_sharedkv.engine_hooks import native_gate_hook, simple_gate_hook
        from pytest_sharedkv.stack.launch.spec import gate_paths

        hook = simple_gate_hook if simple else native_gate_hook
        gate = gate_paths(spec.log_dir)
        envs["B"].update({hook.CONTROL_ENV: str(gate[0]), hook.LOG_ENV: str(gate[1]),
                          hook.CHUNK_ENV: str(spec.chunk_size)})
    named = CONNECTOR_CLASSES[connector]
    return StackLaunch(
        NATIVE, ARMS[NATIVE], tuple(extra),
        tuple((name, tuple(sorted(env.items()))) for name, env in envs.items() if env),
        {**plan.record(), "stack": NATIVE,
         "gate": (SIMPLE_GATE if simple else NATIVE_GATE) if gate is not None else "off"},
        description=f"vllm x2, native offload ({named}, {tier:g} GB CPU each, {blocks} GPU "
                    "blocks)",
        allocator=f"native offloading ({tier:g} GB each, {blocks} GPU blocks)", gate=gate)


NATIVE_ARM_FLAGS = {"--kv-offloading-backend": 1, "--kv-offloading-size": 1,
                    "--enable-prefix-caching": 0}  # what the NATIVE arm's argv gives: values


def native_extra(flags: Sequence[str]) -> list[str]:
    """FLAGS less those the NATIVE arm's argv gives already (each flag with its values)."""
    out: list[str] = []
    i = 0
    while i < len(flags):
        taken = NATIVE_ARM_FLAGS.get(flags[i])
        if taken is None:
            out.append(flags[i])
            i += 1
        else:
            i += 1 + taken
    return out


def native_problem(settings: Settings) -> str | None:
    """Why ``--sharedkv-stack native`` cannot run the corpus these settings send (its
    requests in flight alone would hold the smallest size group on the GPU), or None; the
    same sizing ``native_stack`` does at the start, said before any test."""
    from pytest_sharedkv.corpus.cases import longest_prompt
    from pytest_sharedkv.corpus.choice import case_set
    from pytest_sharedkv.layouts.chunk_size import engine_block_size
    from pytest_sharedkv.models.config_file import read_config
    from pytest_sharedkv.models.copy_model import CopyModelRecipe, config_dict
    from pytest_sharedkv.stack.launch.native_offload import NativeOffloadError, gpu_blocks
    from pytest_sharedkv.stack.launch.spec import max_model_len

    cases = case_set(settings)
    config = (read_config(settings.model) if settings.model is not None
              else config_dict(CopyModelRecipe()))
    longest = longest_prompt(cases)
    try:
        gpu_blocks(group_tokens(cases), longest, cases.answer_tokens, settings.concurrency,
                   engine_block_size(config),
                   max_model_len(longest, cases.answer_tokens, settings.model))
    except NativeOffloadError as exc:
        return (f"{settings.source_of('stack')} native: {exc} (fewer sizes with "
                f"--sharedkv-service-sizes, or a lower --sharedkv-concurrency)")
    return None


def stacked_spec(spec: LaunchSpec, stack: Stack | str, cases: CaseSet, concurrency: int,
                 tiers: InprocessTiers = InprocessTiers(),
                 native_connector: NativeConnector | str = OFFLOADING) -> LaunchSpec:
    """SPEC (the MP stack's, for a launched vLLM pair) for STACK; the in-process stack's
    Redis is planned here (its port; found and started by ``launch_stack_pair``), unless
    TIERS share no remote;
    the native stack runs NATIVE_CONNECTOR (``--sharedkv-native-connector``)."""
    from pytest_sharedkv.models.config_file import read_config

    assert spec.model is not None
    config = read_config(spec.model)
    if Stack(stack) is Stack.INPROCESS:
        from pytest_sharedkv.stack.launch.inprocess_connector import redis_url

        redis = PlannedRedis(spec.log_dir) if tiers.remote else None
        launch = inprocess_stack(spec, config,
                                 redis_url(redis.host, redis.port) if redis else None, redis,
                                 tiers)
        # B's gate hook, not a server's; no KV audit (INPROCESS_NO_AUDIT)
        return replace(spec, arm=launch.arm, gate=False, kv_audit=False, stack=launch)
    launch = native_stack(spec, config, cases, concurrency, native_connector)
    gb = float(launch.record["cpu_gb"])
    return replace(spec, arm=launch.arm, gate=False, l1_size_gb=gb, stack=launch)


def launch_stack_pair(spec: LaunchSpec) -> ReplicaPair:
    """The stacked pair, started: its backend first (the in-process stack's Redis;
    StackUnavailable where none can start here) and its config files, then the replicas;
    the backend stops with the pair."""
    from pytest_sharedkv.stack.launch.providers import launch_vllm_pair

    stack = spec.stack
    assert stack is not None
    backend = stack.backend
    if backend is not None:
        backend.start()
    try:
        if stack.inprocess is not None:
            stack.inprocess.write()
        pair = launch_vllm_pair(spec)
    except BaseException:
        if backend is not None:
            backend.stop()
        raise
    if backend is None:
        return pair
    stacked = ReplicaPair(pair.replicas["A"], pair.replicas["B"], pair.record,
                          stop_server=backend.stop, relaunch=None)
    stacked.starts = pair.starts
    stacked.gpu_kv_tokens = pair.gpu_kv_tokens
    return stacked


# the stub's GPU cache on native offload, in blocks: fewer than a 3k size group's, so its
# local steps hit the stub's own pool (its CPU tier) as well as its own cache
STUB_GPU_BLOCKS = 256


def stub_stack(stack: Stack | str, native_connector: NativeConnector | str = OFFLOADING,
               tiers: InprocessTiers = InprocessTiers()) -> StackLaunch:
    """The stub double's model of STACK: a pool shared through the stubs (in-process over
    a remote) or one pool each (native offload, with a GPU cache of STUB_GPU_BLOCKS that
    evicts), said in its record; no engine runs. Its gate is the stub's own: B zeroes the
    named chunks of what it takes from the pool (on native offload, its own CPU tier, as
    ``native_gate_hook`` or ``simple_gate_hook`` does in B's vLLM). The native connector
    asked for is said (``stands_for``), never as the connector: both are the same pool.
    In-process TIERS without prefix caching: the record says "prefix_caching": false, and
    the stubs' own caches serve nothing (every hit from the pool, as LMCache's would);
    without a remote: "remote_url": None, a pool of each stub's own (its LMCache's
    local_cpu) and no gate, as the launched stack."""
    stack, native_connector = Stack(stack), NativeConnector(native_connector)
    native = {"gate": "the stub's own (--corrupt-control on B's CPU-tier loads)",
              "gpu_blocks": STUB_GPU_BLOCKS,
              "stands_for": CONNECTOR_CLASSES[native_connector]} if stack is NATIVE else {}
    off = stack is INPROCESS and not tiers.prefix_caching
    alone = stack is INPROCESS and not tiers.remote
    return StackLaunch(stack, STUB_ARMS[stack], record={
        "stack": stack, "connector": STUB_CONNECTOR,
        "modelled": f"{stack} modelled by the stub as it models the MP server: "
                    + ("a pool of each stub's own (no remote)" if alone
                       else "one pool both stubs share" if stack is INPROCESS
                       else "a pool of each stub's own, its offload log, a GPU cache of "
                            f"{STUB_GPU_BLOCKS} blocks")
                    + ("; no prefix cache of its own (--no-prefix-caching)" if off else ""),
        **native, **({"prefix_caching": False} if off else {}),
        **({"kv_audit": f"n/a: {INPROCESS_NO_AUDIT}"} if stack is INPROCESS else {}),
        **({"remote_url": None, "gate": "none", "no_gate": INPROCESS_NO_REMOTE}
           if alone else {})},
        description=f"stub x2 (test double) modelling --sharedkv-stack {stack}"
                    + (" without prefix caching" if off else ""))


def stub_spec(spec: LaunchSpec, stack: Stack | str,
              native_connector: NativeConnector | str = OFFLOADING,
              tiers: InprocessTiers = InprocessTiers()) -> LaunchSpec:
    """SPEC on the stub's model of STACK; without the gate (--no-sharedkv-gate) its record
    says "gate": "off", as a launched stack's does."""
    stack = Stack(stack)
    modelled = stub_stack(stack, native_connector, tiers)
    if not spec.gate and modelled.record.get("gate") != "none":
        modelled = replace(modelled, record={**modelled.record, "gate": "off"})
    return replace(spec, arm=STUB_ARMS[stack], kv_audit=spec.kv_audit and stack is not INPROCESS,
                   stack=modelled)
