"""--sharedkv-engine sglang on CPU: the usage errors before any test (a value that is no
engine, a stack or check SGLang cannot run, SGLang missing, an LMCache without the modules
SGLang 0.5.17 imports), the launch plan of an SGLang pair (argv, environment, LMCache
YAML) read without SGLang, how SGLang's answers and counters are read, and compare's
ENGINE CHANGE and the references' engine key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest

from pytest_sharedkv.cli.compare.engines import ENGINE_CHANGE, engine_change, engine_of
from pytest_sharedkv.cli.compare.reading import Report, read_report
from pytest_sharedkv.config.engine import SGLANG_LMCACHE_MODULES, Engine
from pytest_sharedkv.service.references import baseline, engine_key
from pytest_sharedkv.stack.engine_settings import EngineSettings
from pytest_sharedkv.stack.launch.sglang_dialect import engine_fact, sglang_answer, sglang_counters
from pytest_sharedkv.stack.launch.sglang_engine import plan_sglang_pair
from pytest_sharedkv.stack.launch.spec import LaunchSpec
from pytest_sharedkv.stack.launch_record import LaunchRecord
from pytest_sharedkv.stack.metrics import EXTERNAL_HITS, LOCAL_HITS
from pytest_sharedkv.stack.pair import ReplicaPair

STUB = "--sharedkv-provider=stub"


def fake_packages(root: Path, *modules: str) -> Path:
    """A directory holding empty packages MODULES (dotted), for find_spec to find."""
    for module in modules:
        path = root
        for part in module.split("."):
            path = path / part
            path.mkdir(parents=True, exist_ok=True)
            (path / "__init__.py").touch()
    return root


@pytest.mark.parametrize(("args", "message"), [
    (["--sharedkv-engine=tgi"], "--sharedkv-engine: 'tgi' is not one of vllm, sglang"),
    (["--sharedkv-engine=sglang", "--sharedkv-stack=native", STUB],
     "--sharedkv-engine sglang: SGLang reaches LMCache through its MP server alone*"
     "--sharedkv-stack is native*"),
    (["--sharedkv-engine=sglang", "--sharedkv-kv-audit", STUB],
     "--sharedkv-engine sglang: --sharedkv-kv-audit: the KV audit's hook wraps vLLM's MP "
     "connector*n/a on SGLang*"),
    (["--sharedkv-engine=sglang", "--sharedkv-triage", STUB],
     "--sharedkv-engine sglang: --sharedkv-triage's cells*"),
    (["--sharedkv-engine=sglang", "--sharedkv-topology=hosts", STUB],
     "--sharedkv-engine sglang: --sharedkv-topology hosts is not written for SGLang*"),
    (["--sharedkv-engine=sglang", "--sharedkv-vllm-args=--max-num-seqs 4", STUB],
     "--sharedkv-engine sglang: --sharedkv-vllm-args gives flags for `vllm serve`*"),
])
def test_an_engine_that_cannot_run_is_a_usage_error(
        pytester: pytest.Pytester, args: list[str], message: str) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_inprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
    assert "passed" not in result.stdout.str()


def _run_with_path(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                   fake: Path | None, *args: str) -> pytest.RunResult:
    import os

    here = str(Path(__file__).resolve().parent.parent)
    parts = [str(fake)] if fake is not None else []
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([*parts, here]))
    pytester.makepyfile("def test_x(): pass")
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)


def test_sglang_missing_is_a_usage_error_naming_what(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """No sglang here: a launched SGLang pair names both missing modules before any test;
    the stub double needs neither."""
    result = _run_with_path(pytester, monkeypatch, None, "--sharedkv-engine=sglang")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --sharedkv-engine sglang: sglang and sgl_kernel not "
                                 "importable: a launched SGLang pair needs SGLang 0.5.17*"])
    stub = _run_with_path(pytester, monkeypatch, None, "--sharedkv-engine=sglang", STUB)
    stub.assert_outcomes(passed=1)


def test_an_lmcache_without_sglangs_modules_is_a_usage_error(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """SGLang and its kernels present (stand-ins), LMCache as 0.5.7rc2 ships it (no
    lmcache.integration.sglang): named before any test; with 0.5.6's modules it runs."""
    old = fake_packages(tmp_path / "old", "sglang", "sgl_kernel", "lmcache.integration")
    result = _run_with_path(pytester, monkeypatch, old, "--sharedkv-engine=sglang")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "ERROR: --sharedkv-engine sglang: lmcache.integration.sglang.multi_process_adapter, "
        "lmcache.integration.sglang.sglang_adapter, lmcache.integration.sglang.utils not "
        "importable: SGLang 0.5.17's LMCache radix cache (lmc_radix_cache.py) imports them*"
        "0.5.7rc2 deleted them*"])
    new = fake_packages(tmp_path / "new", "sglang", "sgl_kernel", *SGLANG_LMCACHE_MODULES)
    _run_with_path(pytester, monkeypatch, new, "--sharedkv-engine=sglang").assert_outcomes(
        passed=1)
    # a hybrid model: SGLang would serve it without its LMCache radix cache
    (pytester.path / "model").mkdir()
    (pytester.path / "model" / "config.json").write_text(json.dumps(
        {"model_type": "qwen3_next", "layer_types": ["linear_attention", "full_attention"]}))
    hybrid = _run_with_path(pytester, monkeypatch, new, "--sharedkv-engine=sglang",
                            "--sharedkv-model=model")
    assert hybrid.ret == pytest.ExitCode.USAGE_ERROR
    hybrid.stderr.fnmatch_lines(["ERROR: --sharedkv-engine sglang: --sharedkv-model */model is "
                                 "a hybrid model, for which SGLang 0.5.17 builds no LMCache "
                                 "radix cache*copy-attention*"])


def test_the_engine_option_and_its_ini_twin(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nsharedkv_engine = sglang\n")
    pytester.makepyfile("""
        def test_engine(sharedkv_settings):
            assert sharedkv_settings.engine.value == "sglang"
    """)
    pytester.runpytest_inprocess(STUB).assert_outcomes(passed=1)
    result = pytester.runpytest_inprocess(STUB, "--sharedkv-engine=vllm", "-k", "nothing")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED


def _spec(tmp_path: Path, **changes: Any) -> LaunchSpec:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    return LaunchSpec(log_dir=tmp_path, model=model, chunk_size=32, max_model_len=5000,
                      engine=EngineSettings(max_num_seqs=8, gpu_memory_utilization=0.3),
                      serving=Engine.SGLANG, **changes)


def test_the_plan_of_an_sglang_pair(tmp_path: Path) -> None:
    """Each replica: SGLang 0.5.17's server on 127.0.0.1 with its LMCache radix cache
    dialling the suite's server (the YAML's mp_host/mp_port), the hit reports on, the
    suite's engine settings, its own device."""
    plan = plan_sglang_pair(_spec(tmp_path, devices=("0", "1")), 5556, (8001, 8002),
                            (("0",), ("1",)), base_env={})
    assert plan.server_port == 5556
    a, b = plan.replicas
    assert (a.name, b.name) == ("sglang replica A", "sglang replica B")
    argv = list(a.argv)
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    for flag, value in (("--model-path", str(tmp_path / "model")), ("--host", "127.0.0.1"),
                        ("--port", "8001"), ("--lmcache-config-file",
                                             str(tmp_path / "lmcache-sglang-A.yaml")),
                        ("--page-size", "16"), ("--context-length", "5000"),
                        ("--max-running-requests", "8"), ("--mem-fraction-static", "0.3"),
                        ("--attention-backend", "triton")):
        assert argv[argv.index(flag) + 1] == value, flag
    for flag in ("--enable-lmcache", "--enable-cache-report", "--enable-metrics",
                 "--disable-decode-cuda-graph", "--disable-prefill-cuda-graph"):
        assert flag in argv
    assert a.config_text == b.config_text == "mp_host: 127.0.0.1\nmp_port: 5556\n"
    assert dict(a.env)["CUDA_VISIBLE_DEVICES"] == "0"
    assert dict(b.env)["CUDA_VISIBLE_DEVICES"] == "1"
    assert b.log.name == "sglang-B-8002.log" and b.devices == ("1",)


@pytest.mark.parametrize(("changes", "message"), [
    ({"chunk_size": 40}, "LMCache's chunk (40 tokens) is no multiple of SGLang's page (16)"),
    ({"arm": "OFF"}, "an SGLang pair is one LMCache MP server both replicas share"),
    ({"model": None}, "an SGLang pair needs a model"),
])
def test_a_plan_that_cannot_run_is_refused_before_anything_starts(
        tmp_path: Path, changes: dict[str, Any], message: str) -> None:
    spec = _spec(tmp_path)
    from dataclasses import replace

    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan_sglang_pair(replace(spec, **changes), 5556, (1, 2))


SGLANG_METRICS = """# HELP sglang:cached_tokens_total Number of cached prompt tokens by source.
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{cache_source="device",model_name="m"} 32.0
sglang:cached_tokens_total{cache_source="host",model_name="m"} 3008.0
sglang:cached_tokens_total{cache_source="storage_file",model_name="m"} 64.0
sglang:prompt_tokens_total{model_name="m"} 6018.0
"""


def test_sglangs_counters_read_as_local_and_external_hits() -> None:
    counters = sglang_counters(SGLANG_METRICS)
    assert (counters[LOCAL_HITS], counters[EXTERNAL_HITS]) == (32, 3072)
    # no family (--enable-metrics off): unknown, never 0
    assert LOCAL_HITS not in sglang_counters("sglang:prompt_tokens_total 5\n")
    # the family before its first hit (HELP and TYPE only): 0 of each, known
    empty = sglang_counters("# TYPE sglang:cached_tokens_total counter\n")
    assert (empty[LOCAL_HITS], empty[EXTERNAL_HITS]) == (0, 0)


def test_sglangs_usage_reads_as_vllms() -> None:
    cold = {"usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}
    assert sglang_answer(cold)["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    warm = {"usage": {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 4}}}
    assert sglang_answer(warm) == warm
    assert sglang_answer({"choices": []}) == {"choices": []}  # no usage: unknown


def _report(tmp_path: Path, name: str, settings: dict[str, Any] | None = None,
            facts: list[dict[str, Any]] | None = None) -> Report:
    data: dict[str, Any] = {"schema": "pytest-sharedkv/1", "tests": [], "checks": [],
                            "notes": [], "facts": facts or [],
                            "tiers": {"service_regression": {}},
                            "environment": {"settings": settings or {}}}
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return read_report(path)


def test_compare_says_an_engine_change(tmp_path: Path) -> None:
    vllm = _report(tmp_path, "v.json", facts=[{"name": "launch", "value": json.dumps(
        {"argv": ["python", "-c", "vllm main", "serve", "m"], "env": {}})}])
    sglang = _report(tmp_path, "s.json", settings={"engine": "sglang"})
    stub = _report(tmp_path, "stub.json", facts=[{"name": "stack", "value": json.dumps(
        engine_fact(None))}])
    unknown = _report(tmp_path, "u.json")
    assert engine_of(vllm) is Engine.VLLM and engine_of(stub) is Engine.SGLANG
    assert engine_change(vllm, sglang) == (Engine.VLLM, Engine.SGLANG)
    assert engine_change(sglang, stub) is None
    assert engine_change(vllm, unknown) is None  # unknown is never a change
    from pytest_sharedkv.cli.compare.main import compare

    _, lines = compare(vllm, sglang, 0.1)
    assert any(line.startswith(f"{ENGINE_CHANGE}: BEFORE ran vllm replicas, AFTER sglang")
               for line in lines), lines


class _Pair:
    def __init__(self, provider: str, stack: dict[str, Any] | None) -> None:
        self.record = LaunchRecord(provider=provider, description="", replicas=(),
                                   stack=stack)
        self.labels = self.record.labels
        self.topology = None


def _pair(provider: str, stack: dict[str, Any] | None) -> ReplicaPair:
    """A stand-in with what engine_key reads: the record's provider and stack."""
    return cast(ReplicaPair, _Pair(provider, stack))


def test_references_are_keyed_by_engine(tmp_path: Path) -> None:
    assert engine_key(_pair("stub (test double)", engine_fact(None)), "x") == "stub+sglang"
    assert engine_key(_pair("stub (test double)", None), "x") == "stub"
    key = engine_key(_pair("sglang", engine_fact("0.5.17")), "not probed")
    assert key == "sglang-none+lmcache-0.5.6-not-checked"  # no sglang installed here
    model = tmp_path / "copy-x"
    for name in ("vllm-0.26.0+lmcache-0.5.6-compiled", "stub"):
        (model / name).mkdir(parents=True)
    # vLLM's references are no baseline for SGLang's, nor the reverse
    assert baseline(tmp_path, "copy-x", "sglang-0.5.17+lmcache-0.5.6-compiled") is None
    assert baseline(tmp_path, "copy-x", "stub+sglang") is None
    (model / "sglang-0.5.16+lmcache-0.5.6-compiled").mkdir()
    found = baseline(tmp_path, "copy-x", "sglang-0.5.17+lmcache-0.5.6-compiled")
    assert found is not None and found.name == "sglang-0.5.16+lmcache-0.5.6-compiled"


SUITE = str(Path(__file__).resolve().parent.parent / "suites" / "test_service_regression.py")
SERVICE = [SUITE, "-m", "service_regression", "-p", "no:cacheprovider", STUB,
           "--sharedkv-settle-s=0.05", "--sharedkv-service-sizes=3k",
           "--sharedkv-engine=sglang", "--sharedkv-json=r.json", "-k", "not stored_reference"]


def test_the_service_tier_runs_on_the_stub_answering_as_sglang(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stub double answers as SGLang 0.5.17 does (no prompt_tokens_details on a cold
    request, hits in sglang:cached_tokens_total by cache_source): every step, the gate,
    sessions, protocol and the identical requests judged from what SGLang reports; the KV
    audit n/a, said in the header before any test and on its skip."""
    from pytest_sharedkv.config.options import MEASURED_ENV

    monkeypatch.setenv(MEASURED_ENV, "10")
    result = pytester.runpytest_subprocess(*SERVICE)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-3000:]
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["environment"]["settings"]["engine"] == "sglang"
    header = [h for h in report["environment"]["header"] if h.startswith("sharedkv: engine")]
    assert len(header) == 1 and "KV audit n/a" in header[0], header
    steps = {c["key"]["step"]: c for c in report["checks"]
             if c["key"].get("size") == "3k" and c["key"].get("step") != "chain"}
    assert {name: (c["status"], c["passed"], c["trials"], c["detail"]["cached"],
                   c["detail"]["local"], c["detail"]["external"])
            for name, c in steps.items()} == {
        "cold": ("pass", 10, 10, 0, 0, 0),
        "local": ("pass", 10, 10, 30_080, 30_080, 0),
        # B's cross step from the pool: SGLang's cache_source="host"
        "cross": ("pass", 10, 10, 30_080, 0, 30_080),
        "receiver-local": ("pass", 10, 10, 30_080, 30_080, 0),
        "identical requests x4": ("pass", 8, 8, 24_064, 18_048, 6_016),
        "identical requests in sequence x4": ("pass", 8, 8, 24_064, 18_048, 6_016)}
    kinds = {c["kind"]: c["status"] for c in report["checks"]
             if c["kind"] in ("gate", "protocol", "session")}
    assert kinds == {"gate": "pass", "protocol": "pass", "session": "pass"}
    # 13 protocol checks, and the two cache_salt checks recorded as isolation (issue 52)
    assert len([c for c in report["checks"] if c["kind"] == "protocol"]) == 13
    assert [c["status"] for c in report["checks"] if c["kind"] == "isolation"
            and c["key"]["size"] == "protocol"] == ["pass"] * 2
    audit = next(t for t in report["tests"] if "test_kv_audit" in t["nodeid"])
    assert audit["outcome"] == "skipped" and audit["message"].startswith(
        "n/a: the KV audit's hook wraps vLLM's MP connector"), audit
    facts = {f["name"]: f["value"] for f in report["facts"]}
    assert json.loads(facts["stack"])["engine"] == "sglang"
    launches = [json.loads(f["value"]) for f in report["facts"] if f["name"] == "launch"]
    assert all(launch["argv"][-2:] == ["--engine", "sglang"] or "--engine" in launch["argv"]
               for launch in launches) and len(launches) == 2


def test_the_stub_answers_in_sglangs_shape() -> None:
    """Raw, before the suite reads it: a cold answer without prompt_tokens_details, a
    repeat with them, and SGLang's counter by cache_source in /metrics (vLLM's absent)."""
    import urllib.request

    from tests.stub_endpoints import external_stubs

    with external_stubs("--engine", "sglang") as urls:
        url = urls.split(",")[0]

        def complete() -> dict[str, Any]:
            body = json.dumps({"model": "stub", "prompt": "w01 w02 " * 40, "max_tokens": 2,
                               "temperature": 0.0}).encode()
            request = urllib.request.Request(url + "/v1/completions", data=body,
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as response:
                data: dict[str, Any] = json.loads(response.read())
            return data

        cold, warm = complete(), complete()
        with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
            metrics = response.read().decode()
    assert "prompt_tokens_details" not in cold["usage"], cold["usage"]
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, warm["usage"]
    assert 'sglang:cached_tokens_total{cache_source="device"}' in metrics
    assert "vllm:" not in metrics


def test_sglangs_lmcache_key_carries_no_salt() -> None:
    """SGLang #37160's condition, read from LMCache 0.5.6's own code on CPU: the key
    SGLang's MP connector builds for a lookup, retrieve or store (``_create_key``) takes
    no cache_salt, so two tenants' requests for one prompt name one cache entry; the key
    type has the field (vLLM's adapter fills it), and salted keys differ."""
    pytest.importorskip("lmcache.integration.sglang.multi_process_adapter")
    from types import SimpleNamespace

    from lmcache.integration.sglang.multi_process_adapter import LMCacheMPConnector
    from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey

    connector = SimpleNamespace(model_name="m", tp_size=1, worker_id=0)
    tokens = list(range(64))
    tenant_a = LMCacheMPConnector._create_key(connector, tokens, 0, 64, "tenant-a-req")
    tenant_b = LMCacheMPConnector._create_key(connector, tokens, 0, 64, "tenant-b-req")
    assert tenant_a == tenant_b and tenant_a.cache_salt == ""
    salted = [IPCCacheServerKey(model_name="m", world_size=1, worker_id=0,
                                token_ids=tuple(tokens), start=0, end=64, request_id=r,
                                cache_salt=r) for r in ("a", "b")]
    assert salted[0] != salted[1]


def test_the_bundle_numbers_in_the_docs_are_the_recorded_ones() -> None:
    """docs/engines.md's sizes and part counts are fixtures/sglang/bundle-0.5.17.json's
    (measured with pip download and xz; a remeasure changes both or this fails)."""
    root = Path(__file__).resolve().parent.parent
    record = json.loads((root / "fixtures" / "sglang" / "bundle-0.5.17.json").read_text())
    text = " ".join((root / "docs" / "engines.md").read_text().split())
    totals = record["totals"]
    assert totals["core_xz_bytes"] == sum(record["xz"].values())
    assert totals["apart_bytes"] == sum(record["wheels_pinned_apart_from_vllm_0_26_0"].values())
    for number in (record["sglang_kernel_wheel"]["bytes"], record["flash_ops"]["unpacked_bytes"],
                   record["flash_ops"]["deflated_bytes"], totals["core_xz_bytes"],
                   totals["apart_bytes"]):
        assert f"{number} bytes" in text or f"{number} deflated" in text, number
    for key in ("bundle_parts_of_40MiB", "bundle_with_alike_parts_of_40MiB"):
        assert f"{totals[key]} parts of 40 MiB" in text or f"{totals[key]} parts." in text, key
    assert f"With FA3: {totals['with_fa3_parts_of_40MiB']} parts." in text


LAUNCH_SERVER = '''"""A stand-in for sglang.launch_server: reads the LMCache YAML the suite
wrote and serves the stub double answering as SGLang on the port it was given."""
import sys
from pathlib import Path

from pytest_sharedkv.stack.stub.stub_openai import main

args = sys.argv[1:]
config = Path(args[args.index("--lmcache-config-file") + 1]).read_text()
assert config.startswith("mp_host: 127.0.0.1"), config
sys.exit(main(["--port", args[args.index("--port") + 1], "--name", "sglang",
               "--engine", "sglang"]))
'''


def test_a_launched_sglang_pair_starts_and_stops_through_managed_processes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """launch_sglang_pair on CPU with the real LMCache server and a stand-in for SGLang's
    server module: the server first, both replicas as managed processes with the YAML
    naming the server's port, a request read through SGLang's dialect, and a close that
    leaves no process."""
    import importlib.util
    import os

    if importlib.util.find_spec("lmcache") is None:
        pytest.skip("lmcache not installed: the launch starts its real server")

    from pytest_sharedkv.stack.launch.sglang_engine import launch_sglang_pair

    fake = tmp_path / "fake"
    (fake / "sglang").mkdir(parents=True)
    (fake / "sglang" / "__init__.py").write_text("")
    (fake / "sglang" / "launch_server.py").write_text(LAUNCH_SERVER)
    here = str(Path(__file__).resolve().parent.parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(fake), here]))
    logs = tmp_path / "logs"
    logs.mkdir()
    spec = _spec(logs, l1_size_gb=0.25, gate=False, ready_timeout=120)
    pair = launch_sglang_pair(spec)
    try:
        record = pair.record
        assert record.provider == "sglang" and record.stack is not None
        assert record.stack["engine"] == "sglang"
        names = [p.name for p in record.processes]
        assert names[1:] == ["sglang replica A", "sglang replica B"], names
        server = next(p for p in record.processes if p.name not in names[1:])
        port = server.argv[server.argv.index("--port") + 1]
        assert (logs / "lmcache-sglang-B.yaml").read_text() == \
            f"mp_host: 127.0.0.1\nmp_port: {port}\n"
        cold = pair.send("A", "w01 w02 w03 " * 30, max_tokens=2)
        assert (cold.cached_tokens, cold.local_hit_tokens, cold.external_hit_tokens) == \
            (0, 0, 0)
        assert cold.counters_read
        assert pair.has_server  # closed with the pair
    finally:
        leftovers = pair.close()
    assert leftovers == []
    assert not any(r.process is not None and r.process.alive()
                   for r in pair.replicas.values())
    import socket

    with socket.socket() as probe:  # the LMCache server is gone too
        assert probe.connect_ex(("127.0.0.1", int(port))) != 0


def test_the_salt_leak_row_fails_where_the_pool_ignores_the_salt(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang #37160's row on the stub double: the engine's own cache salted, the pool's
    keys without the salt (its LMCache connector's key). The protocol's salt checks fail
    naming the cached tokens (a request under another salt hit the pool); the steps, one
    salt per case, stay exact."""
    from pytest_sharedkv.config.options import MEASURED_ENV
    from tests.launch_faults import StubFaults, plant

    monkeypatch.setenv(MEASURED_ENV, "4")
    plant(pytester, StubFaults(pool_ignores_salt=True))
    # the suite is named by path (this checkout's), so the planted conftest goes in as a
    # plugin module
    (pytester.path / "conftest.py").rename(pytester.path / "planted_faults.py")
    result = pytester.runpytest_subprocess("-p", "planted_faults", *SERVICE[:-1],
                                           "protocol or chain")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    report = json.loads((pytester.path / "r.json").read_text())
    failed = {t["nodeid"].split("[")[-1].rstrip("]") for t in report["tests"]
              if t["outcome"] == "failed"}
    assert failed == {"cache-salt-separates-namespaces-stub",
                      "cache-salt-separates-namespaces-across-replicas-stub"}, failed
    # a hit across cache_salt namespaces is an isolation failure (issue 52), not a protocol one
    leak = next(c for c in report["checks"] if c["kind"] == "isolation"
                and "across-replicas" in str(c["key"]))
    assert leak["status"] == "fail" and "B under another cache_salt after A stored it: " \
        in leak["message"] and not leak["message"].endswith(": 0 cached"), leak


def test_every_flag_the_plan_gives_is_one_sglang_0_5_17_takes(tmp_path: Path) -> None:
    """The plan's flags against SGLang 0.5.17's own list (fixtures/sglang/
    server-args-0.5.17.txt, read from the wheel's server_args.py): a flag it does not take
    would stop both replicas at start, on the GPU host."""
    root = Path(__file__).resolve().parent.parent
    known = {line.strip() for line in
             (root / "fixtures" / "sglang" / "server-args-0.5.17.txt").read_text().splitlines()
             if line.startswith("--")}
    from dataclasses import replace

    spec = _spec(tmp_path)
    spec = replace(spec, engine=replace(spec.engine, load_format="dummy"))
    plan = plan_sglang_pair(spec, 5556, (8001, 8002))
    flags = {arg for arg in plan.replicas[0].argv if arg.startswith("--")}
    assert "--load-format" in flags and flags <= known, sorted(flags - known)
