"""--sharedkv-stack: usage errors before any test, the launched pair each stack runs (argv,
environment, launch record, read back by compare's stack reader), the in-process stack's
Redis started and stopped with the pair, and the stub double modelling a stack."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.cli.compare.reading import Report
from pytest_sharedkv.cli.compare.stacks import INPROCESS, MP, NATIVE, STUB, stack_change, stack_of
from pytest_sharedkv.corpus.cases import Case, CaseSet
from pytest_sharedkv.models.copy_attention_model import AttentionCopyRecipe, config_dict
from pytest_sharedkv.stack.engine_settings import EngineSettings
from pytest_sharedkv.stack.l2 import redis_server
from pytest_sharedkv.stack.launch import stacks as stack_launch
from pytest_sharedkv.stack.launch.providers import build_vllm_pair
from pytest_sharedkv.stack.launch.spec import LaunchSpec, StackUnavailable
from pytest_sharedkv.stack.launch_record import LaunchRecord

HYBRID = {"model_type": "qwen3_next", "layer_types": ["linear_attention", "full_attention"]}
USER_ARGS = ("--max-num-seqs", "4")
REDIS_MISSING = redis_server.missing()  # no redis-server, or no redis-py


def model(tmp_path: Path, config: dict[str, Any]) -> Path:
    path = tmp_path / "model"
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize(("args", "hybrid", "message"), [
    (["--sharedkv-stack=mpi"], False, "--sharedkv-stack: 'mpi' is not one of mp, inprocess, "
                                      "native"),
    (["--sharedkv-stack=inprocess"], False,
     "--sharedkv-stack inprocess: LMCacheConnectorV1 has no hybrid-model support in vLLM "
     "0.26 and the default model (the copy model) is a hybrid; give --sharedkv-model*"),
    (["--sharedkv-stack=inprocess", "--sharedkv-model=model"], True,
     "--sharedkv-stack inprocess: --sharedkv-model */model is a hybrid model*copy-attention*"),
    (["--sharedkv-stack=native", "--sharedkv-endpoints=http://127.0.0.1:9,http://127.0.0.1:10"],
     False, "--sharedkv-stack native: the suite launches the stack it names, and the external "
            "provider*"),
    (["--sharedkv-stack=native", "--sharedkv-triage"], False,
     "--sharedkv-stack native: --sharedkv-triage's controls act on LMCache's MP server*"),
    (["--sharedkv-stack=native", "--sharedkv-topology=hosts"], False,
     "--sharedkv-stack native: --sharedkv-topology hosts runs one LMCache MP server per "
     "replica*"),
    (["--sharedkv-stack=native", "--sharedkv-fault-catalogue=all"], False,
     "--sharedkv-stack native: --sharedkv-fault-catalogue's faults go into LMCache's MP*"),
    (["--sharedkv-stack=native", "--sharedkv-allocators=lazy"], False,
     "--sharedkv-stack native: --sharedkv-allocators chooses the MP server's L1 allocator*"),
    (["--sharedkv-native-connector=simple"], False,
     "--sharedkv-native-connector: only the native stack runs vLLM's own CPU offload, whose "
     "connector it chooses, and --sharedkv-stack is mp; give --sharedkv-stack native or drop "
     "--sharedkv-native-connector"),
    (["--sharedkv-stack=inprocess", "--sharedkv-native-connector=offloading"], False,
     "--sharedkv-native-connector: *and --sharedkv-stack is inprocess; give --sharedkv-stack "
     "native*"),
    (["--sharedkv-stack=native", "--sharedkv-native-connector=fast"], False,
     "--sharedkv-native-connector: 'fast' is not one of offloading, simple"),
])
def test_a_stack_that_cannot_run_is_a_usage_error(
        pytester: pytest.Pytester, args: list[str], hybrid: bool, message: str) -> None:
    model(pytester.path, HYBRID if hybrid else config_dict(AttentionCopyRecipe()))
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_inprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
    assert "passed" not in result.stdout.str()


@pytest.mark.parametrize(("ini", "args", "stack"), [
    ("", [], "mp"),
    ("sharedkv_stack = native", [], "native"),
    ("sharedkv_stack = native", ["--sharedkv-stack=inprocess", "--sharedkv-model=model"],
     "inprocess"),
    ("", ["--sharedkv-stack=inprocess", "--sharedkv-provider=stub"], "inprocess"),
])
def test_the_stack_option_and_its_ini_twin(pytester: pytest.Pytester, ini: str,
                                           args: list[str], stack: str) -> None:
    """The command line wins over the ini file; an attention-only model, or the stub
    (which serves no model), runs in-process; the report's environment names the stack."""
    from pytest_sharedkv.plugin import _environment_data
    from pytest_sharedkv.state import state_of

    model(pytester.path, config_dict(AttentionCopyRecipe()))
    pytester.makeini(f"[pytest]\n{ini}\n")
    config = pytester.parseconfigure(*args)
    assert state_of(config).settings.stack == stack
    assert _environment_data(config, probe=False)["settings"]["stack"] == stack  # the report's


@pytest.mark.parametrize(("ini", "args", "connector"), [
    ("sharedkv_stack = native", [], "offloading"),
    ("sharedkv_stack = native\nsharedkv_native_connector = simple", [], "simple"),
    ("sharedkv_native_connector = simple", ["--sharedkv-stack=native",
                                            "--sharedkv-native-connector=offloading"],
     "offloading"),
])
def test_the_native_connector_option_and_its_ini_twin(
        pytester: pytest.Pytester, ini: str, args: list[str], connector: str) -> None:
    """The command line wins over the ini file; the report's environment names it."""
    from pytest_sharedkv.plugin import _environment_data
    from pytest_sharedkv.state import state_of

    pytester.makeini(f"[pytest]\n{ini}\n")
    config = pytester.parseconfigure(*args)
    assert state_of(config).settings.native_connector == connector
    assert _environment_data(config, probe=False)["settings"]["native_connector"] == connector


def test_the_native_connectors_ini_twin_with_another_stack_is_named(
        pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nsharedkv_native_connector = simple\n")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_inprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: ini option sharedkv_native_connector: only the "
                                 "native stack*drop ini option sharedkv_native_connector"])


def test_a_launched_stack_is_one_matrix_cell_named_by_it(pytester: pytest.Pytester) -> None:
    """No MP server, so no allocator axis: one cell per delay, named by the stack."""
    pytester.makepyfile("""
        import pytest
        @pytest.mark.replica_pair
        def test_x(sharedkv_replica_pair): pass
    """)
    result = pytester.runpytest_inprocess("--sharedkv-provider=vllm", "--sharedkv-stack=native",
                                          "--sharedkv-service-sizes=3k", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*test_x?native?"])
    assert result.ret == pytest.ExitCode.OK
    assert "lazy" not in result.stdout.str() and "mixed" not in result.stdout.str()


def cases(sizes: dict[str, tuple[int, int]]) -> CaseSet:
    """SIZE -> (requests, prompt tokens each)."""
    return CaseSet("copy", 32, [Case(f"{size}-{i}", "measured", size, "x", "0", tokens)
                                for size, (count, tokens) in sizes.items()
                                for i in range(count)])


def spec_for(tmp_path: Path, config: dict[str, Any]) -> LaunchSpec:
    return LaunchSpec(log_dir=tmp_path / "logs", model=model(tmp_path, config), chunk_size=32,
                      l1_size_gb=2.0, max_model_len=4096,
                      engine=EngineSettings(extra_args=USER_ARGS))


def report_of(record: LaunchRecord, stack: str) -> Report:
    facts = [{"name": "launch", "value": json.dumps(p)} for p in record.launches()]
    return Report(Path("r.json"), {"facts": facts, "environment": {
        "settings": {"stack": stack}, "lmcache": {"version": "0.5.6"}}}, None)


def option(argv: list[str], name: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == name]


def test_the_inprocess_stack_launches_lmcache_in_each_replica(tmp_path: Path) -> None:
    spec = stack_launch.stacked_spec(spec_for(tmp_path, config_dict(AttentionCopyRecipe())),
                                     "inprocess", cases({"3k": (4, 3009)}), 8)
    pair = build_vllm_pair(spec, [])
    record = pair.record
    assert [p.name for p in record.processes] == ["vllm replica A", "vllm replica B"]
    files = set()
    for process in record.processes:
        argv, env = list(process.argv), dict(process.env)
        transfer = json.loads(option(argv, "--kv-transfer-config")[0])
        assert transfer["kv_connector"] == "LMCacheConnectorV1"
        assert argv[-2:] == list(USER_ARGS)  # the user's flags stay last
        assert env["PYTHONHASHSEED"] == "0"
        files.add(env["LMCACHE_CONFIG_FILE"])
    assert len(files) == 2  # each replica its own file (its own disk directory)
    assert record.stack is not None and record.stack["connector"] == "LMCacheConnectorV1"
    assert record.stack["backend"] == "redis://" and record.allocator == "in-process (redis://)"
    assert spec.stack is not None and spec.stack.backend is not None
    assert record.stack["remote_url"] == f"redis://127.0.0.1:{spec.stack.backend.port}"
    found = stack_of(report_of(record, "inprocess"))  # from the launch facts alone
    assert found is not None and found.kinds == {INPROCESS}
    assert found.describe() == "LMCache in-process (LMCacheConnectorV1, redis://, LMCache 0.5.6)"
    mp = Report(Path("b.json"), {"facts": [{"name": "launch", "value": json.dumps(
        {"argv": ["python", "-c", "vllm", "serve", "m", "--kv-transfer-config",
                  json.dumps({"kv_connector": "LMCacheMPConnector"})], "env": {}})}]}, None)
    change = stack_change(mp, report_of(record, "inprocess"))
    assert change is not None and change[0].kinds == {MP}


def test_the_native_stack_evicts_the_corpus_to_the_cpu_tier(tmp_path: Path) -> None:
    config = config_dict(AttentionCopyRecipe())
    spec = stack_launch.stacked_spec(spec_for(tmp_path, config), "native",
                                     cases({"3k": (200, 3009), "8k": (40, 8009)}), 8)
    pair = build_vllm_pair(spec, [])
    record = pair.record
    assert record.arm == "NATIVE" and record.server is None and len(record.processes) == 2
    argv = list(record.processes[0].argv)
    assert option(argv, "--kv-offloading-backend") == ["native"]
    assert spec.stack is not None
    assert option(argv, "--kv-offloading-size") == [f"{spec.stack.record['cpu_gb']:g}"]
    blocks = int(option(argv, "--num-gpu-blocks-override")[0])
    assert blocks * 16 < 200 * 3009 // 2  # the 3k group cannot stay on the GPU
    assert argv[-2:] == list(USER_ARGS)
    assert record.stack is not None and record.stack["connector"] == "OffloadingConnector"
    found = stack_of(report_of(record, "native"))
    assert found is not None and found.kinds == {NATIVE}


@pytest.mark.parametrize("gate", [True, False])
def test_the_simple_connector_runs_in_both_replicas_and_its_record_says_so(
        tmp_path: Path, gate: bool) -> None:
    """--sharedkv-native-connector simple: VLLM_USE_SIMPLE_KV_OFFLOAD=1 in both replicas
    (vLLM 0.26's switch to SimpleCPUOffloadConnector), the same flags; the record, the
    description and compare's reading of the argv name the connector; B's gate is the
    simple connector's hook, not the OffloadingConnector's."""
    from dataclasses import replace

    from pytest_sharedkv.engine_hooks import native_gate_hook, simple_gate_hook
    from pytest_sharedkv.stack.launch.native_offload import SIMPLE_ENV

    base = replace(spec_for(tmp_path, config_dict(AttentionCopyRecipe())), gate=gate)
    group = cases({"3k": (200, 3009)})
    spec = stack_launch.stacked_spec(base, "native", group, 8, native_connector="simple")
    record = build_vllm_pair(spec, []).record
    default = build_vllm_pair(stack_launch.stacked_spec(
        replace(base, log_dir=tmp_path / "default"), "native", group, 8), []).record
    env = {p.name: dict(p.env) for p in record.processes}
    assert env["vllm replica A"][SIMPLE_ENV] == env["vllm replica B"][SIMPLE_ENV] == "1"
    assert all(SIMPLE_ENV not in dict(p.env) for p in default.processes)
    for flag in ("--kv-offloading-backend", "--kv-offloading-size", "--num-gpu-blocks-override"):
        assert option(list(record.processes[1].argv), flag) == option(
            list(default.processes[1].argv), flag)
    assert record.stack is not None and record.stack["connector"] == "SimpleCPUOffloadConnector"
    assert "SimpleCPUOffloadConnector" in record.description
    assert native_gate_hook.CONTROL_ENV not in env["vllm replica B"]
    if gate:
        assert env["vllm replica B"][simple_gate_hook.CONTROL_ENV] == str(
            record.paths.gate_control)
        assert simple_gate_hook.CONTROL_ENV not in env["vllm replica A"]
        assert record.stack["gate"] == stack_launch.SIMPLE_GATE
    else:
        assert simple_gate_hook.CONTROL_ENV not in env["vllm replica B"]
    found = stack_of(report_of(record, "native"))  # from the launch facts alone
    assert found is not None and found.describe() == (
        "vLLM native offload (SimpleCPUOffloadConnector, CPU)")
    change = stack_change(report_of(default, "native"), report_of(record, "native"))
    assert change is not None  # one connector for the other: a stack change


def test_the_stub_says_which_native_connector_it_stands_for(tmp_path: Path) -> None:
    from pytest_sharedkv.stack.launch.providers import stub_pair

    pair = stub_pair(stack_launch.stub_spec(LaunchSpec(log_dir=tmp_path), "native", "simple"))
    try:
        assert pair.record.stack is not None
        assert pair.record.stack["stands_for"] == "SimpleCPUOffloadConnector"
        assert pair.record.stack["connector"] == stack_launch.STUB_CONNECTOR
    finally:
        assert pair.close() == []


def test_a_native_corpus_that_fits_the_gpu_cannot_run(tmp_path: Path) -> None:
    with pytest.raises(StackUnavailable, match="--sharedkv-stack native: "
                       "group_tokens"):
        stack_launch.stacked_spec(spec_for(tmp_path, config_dict(AttentionCopyRecipe())),
                                  "native", cases({"3k": (4, 3009)}), 8)


def test_planning_the_inprocess_stack_needs_no_redis_its_launch_names_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_sharedkv.stack.launch import providers

    monkeypatch.setattr(redis_server, "find_redis_server", lambda path=None: None)
    spec = stack_launch.stacked_spec(spec_for(tmp_path, config_dict(AttentionCopyRecipe())),
                                     "inprocess", cases({"3k": (4, 3009)}), 8)
    assert spec.stack is not None and spec.stack.backend is not None
    url = f"redis://127.0.0.1:{spec.stack.backend.port}"
    assert spec.stack.inprocess is not None
    assert spec.stack.inprocess.settings.remote_url == url

    def launched(_: LaunchSpec) -> None:
        raise AssertionError("the replicas started without their Redis")

    monkeypatch.setattr(providers, "launch_vllm_pair", launched)
    with pytest.raises(StackUnavailable,
                       match=r"--sharedkv-stack inprocess: no redis-server: none on PATH"):
        stack_launch.launch_stack_pair(spec)
    assert spec.stack.backend.stop() == []  # nothing was started


@pytest.mark.skipif(REDIS_MISSING is not None, reason=str(REDIS_MISSING))
def test_the_inprocess_redis_stops_with_the_pair_or_a_failed_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_sharedkv.stack.l2.redis_server import ping
    from pytest_sharedkv.stack.launch import providers

    spec = stack_launch.stacked_spec(spec_for(tmp_path, config_dict(AttentionCopyRecipe())),
                                     "inprocess", cases({"3k": (4, 3009)}), 8)
    assert spec.stack is not None and spec.stack.backend is not None
    port = spec.stack.backend.port

    def failed(_: LaunchSpec) -> None:
        assert ping("127.0.0.1", port) is None  # the backend answers before the replicas start
        raise RuntimeError("replica A did not start")

    monkeypatch.setattr(providers, "launch_vllm_pair", failed)
    with pytest.raises(RuntimeError, match="replica A"):
        stack_launch.launch_stack_pair(spec)
    assert ping("127.0.0.1", port) is not None  # stopped
    assert spec.stack.inprocess is not None
    assert all(r.config_file.is_file() for r in spec.stack.inprocess.replicas)

    monkeypatch.setattr(providers, "launch_vllm_pair", lambda s: build_vllm_pair(s, []))
    pair = stack_launch.launch_stack_pair(spec)
    assert ping("127.0.0.1", port) is None and pair.has_server
    assert pair.close() == []
    assert ping("127.0.0.1", port) is not None  # stopped with the pair


@pytest.mark.parametrize(("stack", "flag"), [("inprocess", "--pool"),
                                             ("native", "--offload-log")])
def test_the_stub_models_a_stack_and_says_so(tmp_path: Path, stack: str, flag: str) -> None:
    from pytest_sharedkv.stack.launch.providers import stub_pair

    pair = stub_pair(stack_launch.stub_spec(LaunchSpec(log_dir=tmp_path), stack))
    try:
        record = pair.record
        assert flag in record.processes[0].argv
        assert record.stack is not None and record.stack["stack"] == stack
        assert "modelled by the stub" in record.stack["modelled"]
        assert record.description == f"stub x2 (test double) modelling --sharedkv-stack {stack}"
        found = stack_of(report_of(record, stack))
        assert found is not None and found.kinds == {STUB}  # never read as the real stack
    finally:
        assert pair.close() == []



def test_the_attention_only_copy_model_is_served_the_copy_corpus(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--sharedkv-model at the attention-only copy model: the copy corpus (answers by the
    copy rule, not a text corpus's A-cold references), built from the hybrid's vocabulary
    recipe for the model's own chunk (two 16-token blocks: the committed manifest's)."""
    from pytest_sharedkv.config.options import Settings
    from pytest_sharedkv.corpus import choice, copy_corpus
    from pytest_sharedkv.models.copy_model import CopyModelRecipe

    path = model(tmp_path, config_dict(AttentionCopyRecipe()))
    settings = Settings(model=path)
    assert choice.served_kind(settings) == "copy"
    assert choice.served_kind(Settings(model=model(tmp_path / "h", HYBRID))) == "text"

    class Built(Exception):
        pass

    def load(manifest: Path, recipe: CopyModelRecipe) -> None:
        raise Built(manifest.name, recipe)

    monkeypatch.setattr(copy_corpus, "load", load)
    with pytest.raises(Built) as built:
        choice.case_set(settings)
    assert built.value.args == ("copy-corpus-c32.json", CopyModelRecipe())


def test_the_native_stack_runs_a_hybrid_with_its_mamba_cache_mode(tmp_path: Path) -> None:
    """The copy model (Qwen3-Next) runs mamba_cache_mode align, given after the arm's own
    flags; its padded pages leave the bytes per token unknown, so the CPU tier is the
    pool's size."""
    from pytest_sharedkv.models.copy_model import CopyModelRecipe
    from pytest_sharedkv.models.copy_model import config_dict as hybrid_config

    spec = stack_launch.stacked_spec(spec_for(tmp_path, hybrid_config(CopyModelRecipe())),
                                     "native", cases({"3k": (200, 3009)}), 8)
    argv = list(build_vllm_pair(spec, []).record.processes[0].argv)
    assert option(argv, "--mamba-cache-mode") == ["align"]
    assert option(argv, "--kv-offloading-size") == ["2"]
    assert argv.count("--enable-prefix-caching") == 1
    assert argv[-2:] == list(USER_ARGS)


def test_the_stub_provider_runs_the_stack_it_is_given(pytester: pytest.Pytester) -> None:
    """Through the plugin's own fixtures: --sharedkv-provider stub --sharedkv-stack native
    gives the test a stub pair whose record names the stack it models."""
    pytester.makepyfile("""
        import pytest
        @pytest.mark.replica_pair
        def test_x(sharedkv_replica_pair):
            record = sharedkv_replica_pair.record
            assert record.stack["stack"] == "native" and record.arm == "NATIVE"
            assert "--offload-log" in record.processes[0].argv
    """)
    result = pytester.runpytest_inprocess("--sharedkv-provider=stub", "--sharedkv-stack=native")
    result.assert_outcomes(passed=1)


def test_the_native_connector_option_reaches_the_pair(pytester: pytest.Pytester) -> None:
    """Through the plugin's fixtures: the stub's record says which connector it stands for."""
    pytester.makepyfile("""
        import pytest
        @pytest.mark.replica_pair
        def test_x(sharedkv_replica_pair):
            assert sharedkv_replica_pair.record.stack["stands_for"] == (
                "SimpleCPUOffloadConnector")
    """)
    result = pytester.runpytest_inprocess("--sharedkv-provider=stub", "--sharedkv-stack=native",
                                          "--sharedkv-native-connector=simple")
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize(("sizes", "error"), [([], True), (["--sharedkv-service-sizes=3k"], False)])
def test_a_corpus_the_native_stack_cannot_size_is_a_usage_error(
        pytester: pytest.Pytester, sizes: list[str], error: bool) -> None:
    """All four sizes at concurrency 8: eight 128k requests in flight would hold the 8k
    group on the GPU, said before any test; the 3k group alone runs."""
    pytester.makepyfile("""
        import pytest
        @pytest.mark.replica_pair
        def test_x(sharedkv_replica_pair): pass
    """)
    result = pytester.runpytest_inprocess("--sharedkv-provider=vllm", "--sharedkv-stack=native",
                                          "--collect-only", *sizes)
    if error:
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines(["ERROR: --sharedkv-stack native: group_tokens: * prompt "
                                     "tokens would stay on a GPU cache*--sharedkv-service-sizes*"])
    else:
        assert result.ret == pytest.ExitCode.OK


class Facts:
    """A fact sink (report.records.ResultSink's ``fact``) that keeps (name, value)."""

    def __init__(self) -> None:
        self.facts: list[dict[str, str]] = []

    def fact(self, name: str, value: str) -> None:
        self.facts.append({"name": name, "value": value})


@pytest.mark.parametrize("stack", ["inprocess", "native"])
def test_the_stack_reaches_the_report_as_a_fact(tmp_path: Path, stack: str) -> None:
    """record_launches puts the launch record's stack in the report; compare reads it as a
    fact, with no launch facts to read the argv of (and as the argv would read it)."""
    sizes = {"3k": (200, 3009)} if stack == "native" else {"3k": (4, 3009)}
    spec = stack_launch.stacked_spec(spec_for(tmp_path, config_dict(AttentionCopyRecipe())),
                                     stack, cases(sizes), 8)
    pair = build_vllm_pair(spec, [])
    sink = Facts()
    pair.record_launches(sink)
    stacked = [json.loads(f["value"]) for f in sink.facts if f["name"] == "stack"]
    assert stacked == [json.loads(json.dumps(dict(pair.record.stack or {})))]
    only = Report(Path("r.json"), {"facts": [f for f in sink.facts if f["name"] == "stack"],
                                   "environment": {"lmcache": {"version": "0.5.6"}}}, None)
    found = stack_of(only)
    assert found is not None and found.kinds == {INPROCESS if stack == "inprocess" else NATIVE}
    assert stack_change(only, report_of(pair.record, stack)) is None  # fact == argv
