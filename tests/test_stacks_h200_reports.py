"""The H200 runs of 2026-12-03 on stacks other than the LMCache MP server's shared pair
(fixtures/lmcache/h200/), read as the product reads a report: vLLM 0.26.0, 3k, KV audit on
by default.

``native-offloading-vllm-0.26.0``, ``native-simple-vllm-0.26.0``: vLLM's native offload
(``OffloadingConnector``, ``SimpleCPUOffloadConnector``), no LMCache, copy model.
``inprocess-0.5.6-redis-ca``: LMCache 0.5.6's in-process connector (``LMCacheConnectorV1``)
with a Redis remote; ``inprocess-0.5.6-4463-local-cpu``: the same with no remote, prefix
caching off and an 8 GB local CPU tier; ``service-0.5.6-compiled-mixed-ca``: the MP stack
(compiled, mixed) as their control, all three on the attention-only copy model.
``hosts-0.5.6-compiled-l2-write``: the L2 write-failure cell across hosts (LMCache 0.5.6
compiled, mixed, copy model). The ``*-engine.log`` files hold a few engine-log lines."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pytest_sharedkv.cli.compare.reading import Report
from pytest_sharedkv.report.records import Check
from pytest_sharedkv.report.terminal import verdict
from pytest_sharedkv.service.summary import boundary_verdicts, verdicts
from pytest_sharedkv.stack.launch.native_offload import STATE_ALIGNED, boundary_cached
from tests.h200_logs import sections
from tests.recorded import LMCACHE_H200, checks, read, run_log

NATIVE = "native-offloading-vllm-0.26.0"
SIMPLE = "native-simple-vllm-0.26.0"
REDIS = "inprocess-0.5.6-redis-ca"
LOCAL = "inprocess-0.5.6-4463-local-cpu"
CONTROL = "service-0.5.6-compiled-mixed-ca"
WRITE = "hosts-0.5.6-compiled-l2-write"
NATIVE_PAIR = "native offloading (8 GB each, 1521 GPU blocks)"
STORED = "suites/test_service_regression.py::test_stored_reference["


def _service(report: Report) -> list[Check]:
    return checks(report, "service_regression")


def _fact(report: Report, name: str) -> dict[str, Any]:
    value = next(f["value"] for f in report.data["facts"] if f["name"] == name)
    return dict(json.loads(value))


def _failed(report: Report) -> list[str]:
    """The failed tests other than the stored references (none recorded for these keys)."""
    return sorted(r.nodeid.split("::")[1] for r in run_log(report).tests.values()
                  if r.outcome == "failed" and not r.nodeid.startswith(STORED))


def _stored_missing(report: Report) -> int:
    return sum(1 for r in run_log(report).tests.values()
               if r.nodeid.startswith(STORED) and r.outcome == "failed"
               and "no stored reference for" in r.message)


def _steps(report: Report) -> dict[str, tuple[int, int, int, int, int]]:
    """Each 3k step: (exact, of, cached, own-cache hits, pool hits)."""
    return {str(c.key["step"]): (c.passed, c.trials, c.detail["cached"], c.detail["local"],
                                 c.detail["external"])
            for c in _service(report) if c.key.get("size") == "3k"
            and c.key.get("step") in ("cold", "local", "cross", "receiver-local")}


@pytest.mark.parametrize(("name", "connector"), [(NATIVE, "OffloadingConnector"),
                                                 (SIMPLE, "SimpleCPUOffloadConnector")])
def test_native_offload_reloaded_nothing_for_a_prompt_of_whole_blocks_as_the_rule_now_expects(
        name: str, connector: str) -> None:
    """Both connectors, mamba_cache_mode align: the 1,024- and 2,048-token prompts (whole
    blocks of 16) reloaded 0 tokens from the replica's CPU tier, their neighbours whole
    blocks of all but the last token, every answer exact. The cell failed under the rule
    of its day (1,008 and 2,032 expected); what it measured is
    ``boundary_cached(n, 16, STATE_ALIGNED)``, the rule the product expects now."""
    report = read(LMCACHE_H200 / f"{name}.json")
    stack = _fact(report, "stack")
    assert (stack["connector"], stack["block_size"], stack["mamba_cache_mode"]) == (
        connector, 16, "align")
    [cell] = [c for c in _service(report) if c.key.get("size") == "boundary"]
    lengths = cell.detail["lengths"]
    assert cell.detail["cached_each"] == {
        "boundary-1023": 1008, "boundary-1024": 0, "boundary-1025": 1024,
        "boundary-2047": 2032, "boundary-2048": 0, "boundary-2049": 2048}
    assert cell.detail["cached_each"] == {k: boundary_cached(n, 16, STATE_ALIGNED)
                                          for k, n in lengths.items()}
    assert cell.detail["expected_cached"] == {k: boundary_cached(n, 16)
                                              for k, n in lengths.items()}
    assert (cell.kind, cell.status, cell.passed, cell.trials) == ("hits", "fail", 6, 6)
    [line] = boundary_verdicts(NATIVE_PAIR, [cell])
    assert "FAIL (hits): 6/6 exact; request boundary-1024 (1024 tokens, exactly 64 blocks " \
        "of 16), step reload on replica A: 0 tokens cached" in line, line


@pytest.mark.parametrize(("name", "sessions"), [(NATIVE, "48/48"), (SIMPLE, "47/48")])
def test_native_offload_answers_every_step_exactly(name: str, sessions: str) -> None:
    """Each replica reloads only its own CPU tier: 200/200 exact in every step, the gate
    proven on B's CPU-tier loads, 8/8 identical requests exact. Besides the boundary cell
    and the 200 references never stored for this key, the simple connector failed one
    session turn: session-06 turn 5 on B (3,392 tokens cached) answered one right token and
    then ' <miss>'."""
    report = read(LMCACHE_H200 / f"{name}.json")
    service = _service(report)
    assert verdict(run_log(report)) == "FAIL"
    assert {k: v[:2] for k, v in _steps(report).items()} == {
        step: (200, 200) for step in ("cold", "local", "cross", "receiver-local")}
    lines = verdicts(service)
    assert f"VERDICT {NATIVE_PAIR}: 200/200 requests exact in every step (cold, local, " \
        f"cross-replica, receiver-local), hits as expected; sessions {sessions} turns, " \
        "protocol 15/15" in lines
    assert any(x.startswith(f"GATE {NATIVE_PAIR}: sensitivity proven") for x in lines)
    assert any(x.startswith(f"IDENTICAL {NATIVE_PAIR}: ") and "8/8 answers exact" in x
               for x in lines)
    assert _stored_missing(report) == 200
    wrong = [c for c in service if c.key.get("size") == "session" and c.status == "fail"]
    if name == NATIVE:
        assert _failed(report) == ["test_offload_block_boundaries[native]"] and not wrong
        return
    assert _failed(report) == ["test_offload_block_boundaries[native]",
                               "test_session_turns[session-06-native]"]
    [session] = wrong
    assert (session.detail["session"], session.passed, session.trials) == ("session-06", 5, 6)
    turn = session.detail["turns"][5]
    assert turn["cached"] == 3392 and turn["text"].startswith(" w37 <miss> <miss>")


def test_the_in_process_connector_with_a_redis_remote_answered_every_lmcache_served_request_wrong(
        ) -> None:
    """The attention-only model, prefix caching on, 2 GB local CPU, Redis remote: A's own
    prefix cache answered its local step exactly (200/200); every request B was served
    through LMCache answered wrong from token 0 (' <miss> ...'): cross 0/200, receiver-local
    0/200 (B's prefix cache now holding what LMCache loaded), the identical requests 0/8,
    every session 3 of 6 turns. A cache_salt did not separate namespaces (3,008 cached under
    another salt). The audit is VOID: its hook never saw the connector register KV caches."""
    report = read(LMCACHE_H200 / f"{REDIS}.json")
    service = _service(report)
    assert verdict(run_log(report)) == "FAIL"
    stack = _fact(report, "stack")
    assert (stack["connector"], stack["backend"], stack["prefix_caching"]) == (
        "LMCacheConnectorV1", "redis://", True)
    assert stack["replicas"]["A"]["config"]["max_local_cpu_size"] == 2.0
    assert _steps(report) == {"cold": (200, 200, 0, 0, 0),
                              "local": (200, 200, 601600, 601600, 0),
                              "cross": (0, 200, 601600, 0, 601600),
                              "receiver-local": (0, 200, 601600, 601600, 0)}
    sessions = [c for c in service if c.key.get("size") == "session"]
    assert len(sessions) == 8 and {(c.passed, c.trials) for c in sessions} == {(3, 6)}
    [line] = [x for x in verdicts(service) if x.startswith("VERDICT")]
    assert line.startswith("VERDICT in-process (redis://): 200 of 200 requests answered "
                           "wrong after cross-replica pool hits"), line
    audit = next(c for c in service if c.key.get("size") == "audit")
    assert (audit.status, audit.detail["compared"]) == ("void", 0)
    assert audit.message.startswith("VOID: the audit hook never saw replica A or B register")
    salts = {str(c.key["step"]): c.message for c in service
             if c.kind == "protocol" and c.status == "fail"}
    assert salts == {
        "cache-salt-separates-namespaces": "the same prompt under another cache_salt: 3008 "
                                           "cached",
        "cache-salt-separates-namespaces-across-replicas": "B under another cache_salt "
                                                           "after A stored it: 3008 cached"}
    assert _stored_missing(report) == 200


def test_the_in_process_connector_alone_answers_wrong_from_its_own_local_cpu_tier(
        ) -> None:
    """No remote, prefix caching off, 8 GB local CPU: each replica served only itself, and
    every request LMCache served from that tier was wrong (LMCache issue #4463's case):
    local on A 0/200, receiver-local on B 0/200, 601,600 tokens each from LMCache; cold on
    A and cross on B (nothing to share: 0 cached) 200/200. The gate is unproven (no shared
    tier to corrupt), the audit VOID."""
    report = read(LMCACHE_H200 / f"{LOCAL}.json")
    service = _service(report)
    assert verdict(run_log(report)) == "FAIL"
    stack = _fact(report, "stack")
    assert (stack["connector"], stack["remote_url"], stack["prefix_caching"]) == (
        "LMCacheConnectorV1", None, False)
    assert stack["replicas"]["A"]["config"]["max_local_cpu_size"] == 8.0
    assert _steps(report) == {"cold": (200, 200, 0, 0, 0),
                              "local": (0, 200, 601600, 0, 601600),
                              "cross": (200, 200, 0, 0, 0),
                              "receiver-local": (0, 200, 601600, 0, 601600)}
    gate = next(c for c in service if c.key.get("size") == "gate")
    assert gate.status == "unproven"
    audit = next(c for c in service if c.key.get("size") == "audit")
    assert audit.status == "void"
    sessions = [c for c in service if c.key.get("size") == "session"]
    assert sum(c.passed for c in sessions) == 30 and sum(c.trials for c in sessions) == 48


@pytest.mark.parametrize("name", [REDIS, LOCAL])
def test_the_in_process_engines_ran_lmcache_on_the_attention_layers_without_the_hybrid_manager(
        name: str) -> None:
    """Each replica's engine log: vLLM turned off its hybrid KV cache manager for the
    connector, and LMCache's KV shape is the attention-only model's 2 layers of 32-token
    chunks (5 KV heads of 256)."""
    logs = sections(LMCACHE_H200 / f"{name}-engine.log")
    assert len(logs) == 2
    for text in logs.values():
        assert "Turning off hybrid kv cache manager because `--kv-transfer-config` selects " \
            "a KV connector that does not support it" in text
        assert "Resolved architecture: Qwen3ForCausalLM" in text
        assert "num_layer: 2, chunk_size: 32" in text and "kv shape: (2, 2, 32, 5, 256)" in text


def test_the_mp_stack_on_the_same_model_answers_every_step_exactly() -> None:
    """The control: LMCache's MP server (compiled, mixed) on the attention-only model the
    in-process runs served: 200/200 exact in every step, gate proven, 8/8 identical, sessions
    48/48, the audit 80,716 digests with only the gate's mismatching (31.1 us an audited
    token): the in-process failure is the connector's, not the model's. Its one failing
    check is the hit accounting: the 4 GiB GPU cache (419,424 tokens) cannot hold the 3k
    group, so A's and B's own prefix caches had evicted it and the pool served 601,600."""
    report = read(LMCACHE_H200 / f"{CONTROL}.json")
    service = _service(report)
    assert {k: v[:2] for k, v in _steps(report).items()} == {
        step: (200, 200) for step in ("cold", "local", "cross", "receiver-local")}
    assert _steps(report)["local"][2:] == (601600, 0, 601600)
    lines = verdicts(service)
    assert "VERDICT mixed: 200/200 requests exact in every step (cold, local, cross-replica, " \
        "receiver-local), hits as expected; sessions 48/48 turns, protocol 15/15" in lines
    assert any(x.startswith("GATE mixed: sensitivity proven") for x in lines)
    audit = next(c for c in service if c.key.get("size") == "audit")
    assert (audit.status, audit.detail["compared"], audit.detail["compared_state"]) == (
        "pass", 80716, 0)
    assert round(audit.detail["cost_us_per_token"], 1) == 31.1
    assert _failed(report) == ["test_steps_account_for_every_hit[mixed]",
                               "test_the_served_model_sees_corrupted_kv"]
    assert _stored_missing(report) == 200
    hits = {str(c.key["step"]): c.status for c in service if c.kind == "hits"
            and c.key.get("size") == "3k"}
    assert hits == {"local": "fail", "cross": "pass", "receiver-local": "fail"}
    for text in sections(LMCACHE_H200 / f"{CONTROL}-engine.log").values():
        assert "GPU KV cache size: 419,424 tokens" in text
    # the same model as the in-process runs: the references' key names it
    key = "no stored reference for ca-37048cdef3a3/"
    for name in (CONTROL, REDIS, LOCAL):
        assert any(key in r.message for r in run_log(read(LMCACHE_H200 / f"{name}.json"))
                   .tests.values()), name


def test_refused_l2_writes_left_every_later_answer_exact_and_no_hit_past_what_the_l2_held(
        ) -> None:
    """A Redis L2 capped at 55,202,640 bytes (chunks of 82,184) refused 66 writes while both
    servers stored the same 8 prompts (their writers logged 282 and 308 keys unwritten). It
    held 5 prompts whole, one in part (86 of 94 chunks) and two not at all: B's hits were
    3,008 tokens for five, 1,120 (35 chunks) for the one in part, 0 for two, every answer
    exact and the audit's 515 digests clean. PASS, 454 s."""
    report = read(LMCACHE_H200 / f"{WRITE}.json")
    assert verdict(run_log(report)) == "PASS"
    [cell] = [c for c in _service(report) if c.key.get("step") == "l2 write failure"]
    assert (cell.status, cell.passed, cell.trials) == ("pass", 8, 8)
    d = cell.detail
    assert (d["limit_bytes"], d["chunk_bytes"], d["refused"]) == (55202640, 82184, 66)
    assert d["failed_keys"] == {"server 1": 282, "server 2": 308}
    assert sorted(d["held_whole"].values(), reverse=True) == [94, 94, 94, 94, 94, 86, 0, 0]
    assert d["cached_by_request"] == {**{f"3k-00{i}": 3008 for i in range(5)},
                                      "3k-005": 1120, "3k-006": 0, "3k-007": 0}
    assert (d["splits"]["3k-005"]["retained"], d["splits"]["3k-005"]["l2"]) == (35, 35)
    assert (d["audit"]["compared"], d["audit"]["mismatches"]) == (515, 0)
    assert d["l2"].startswith("resp -> redis-server")
    assert verdicts([cell]) == [
        "L2 WRITE mixed: 66 L2 write(s) refused while both replicas stored the same prompts "
        "(a Redis at its memory limit): 8/8 later answers exact (6 with hits from that L2, "
        "2 hit nothing), no hit past "
        "what it held, the audit clean"]


NATIVE_CA = "native-offloading-ca-vllm-0.26.0"
NATIVE_2 = "native-offloading-vllm-0.26.0-2-cut"
SIMPLE_2 = "native-simple-vllm-0.26.0-2-cut"
SIMPLE_3 = "native-simple-vllm-0.26.0-3"


def _boundary(name: str) -> Check:
    [cell] = [c for c in _service(read(LMCACHE_H200 / f"{name}.json"))
              if c.key.get("size") == "boundary"]
    return cell


def test_on_the_attention_only_model_a_prompt_of_whole_blocks_reloaded_whole() -> None:
    """The OffloadingConnector on the attention-only copy model (no recurrent group): the
    1,024- and 2,048-token prompts reloaded every token (9,184 in all), which the rule of
    that run's code (whole blocks of all but the last token) failed; ``hit_rule`` now
    gives WHOLE_PROMPT for this stack, and its cached tokens are what was measured. Every
    other check of the run passed but the copy model's corruption matrix (a user model)."""
    from pytest_sharedkv.stack.launch.native_offload import WHOLE_PROMPT, hit_rule

    report = read(LMCACHE_H200 / f"{NATIVE_CA}.json")
    stack = _fact(report, "stack")
    assert (stack["connector"], stack["mamba_cache_mode"]) == ("OffloadingConnector", None)
    assert hit_rule(stack) == WHOLE_PROMPT
    cell = _boundary(NATIVE_CA)
    assert cell.detail["cached_each"] == {
        k: boundary_cached(n, 16, WHOLE_PROMPT) for k, n in cell.detail["lengths"].items()}
    assert cell.detail["cached"] == 9184 and (cell.passed, cell.trials) == (6, 6)
    assert _failed(report) == ["test_offload_block_boundaries[native]",
                               "test_the_served_model_sees_corrupted_kv"]
    assert _steps(report) == {"cold": (200, 200, 0, 0, 0),
                              "local": (200, 200, 601600, 0, 601600),
                              "cross": (200, 200, 0, 0, 0),
                              "receiver-local": (200, 200, 601600, 0, 601600)}


@pytest.mark.parametrize("name", [NATIVE_2, SIMPLE_3])
def test_with_the_rule_in_place_the_boundary_stage_passes_on_the_copy_model(name: str) -> None:
    """The runs made with ``hit_rule`` in the code: both connectors' boundary cells pass,
    every answer exact, 0 tokens for the prompts of whole blocks."""
    cell = _boundary(name)
    assert (cell.status, cell.passed, cell.trials) == ("pass", 6, 6)
    assert cell.detail["cached_each"]["boundary-1024"] == 0
    assert cell.detail["cached_each"] == {
        k: boundary_cached(n, 16, STATE_ALIGNED) for k, n in cell.detail["lengths"].items()}


def test_the_simple_connector_answered_one_session_turn_wrong_in_each_of_three_runs() -> None:
    """vLLM's SimpleCPUOffloadConnector (vLLM #45704's path) on the copy model: in each of
    three runs one session turn on B answered wrong, every other step exact (session-06
    turn 5, then session-00 turn 3 twice); the OffloadingConnector answered every session
    turn exactly in its three runs (two on the copy model, one on the attention-only)."""
    def wrong_turns(name: str) -> dict[str, int]:
        service = _service(read(LMCACHE_H200 / f"{name}.json"))
        sessions = [c for c in service if c.key.get("size") == "session"]
        assert len(sessions) == 8 and {c.trials for c in sessions} == {6}, name
        return {str(c.detail["session"]): c.trials - c.passed for c in sessions
                if c.passed < c.trials}

    assert wrong_turns(SIMPLE) == {"session-06": 1}
    assert wrong_turns(SIMPLE_2) == wrong_turns(SIMPLE_3) == {"session-00": 1}
    failed = {r.nodeid.split("::")[1]: r.message for r in
              run_log(read(LMCACHE_H200 / f"{SIMPLE_3}.json")).tests.values()
              if r.outcome == "failed"}
    assert list(failed) == ["test_session_turns[session-00-native]"]
    assert "session-00 turn 3 on B (source chunk 63): answered ' <miss> <miss>" in \
        failed["test_session_turns[session-00-native]"]
    for name in (NATIVE, NATIVE_2, NATIVE_CA):
        assert wrong_turns(name) == {}, name


def test_the_verdict_counts_the_wrong_answers_of_the_replicas_own_steps() -> None:
    """#4463's configuration answered every LMCache-served request wrong on the replicas'
    own steps and had nothing to share across them: the VERDICT says so, not a hit
    accounting failure."""
    [line] = [x for x in verdicts(_service(read(LMCACHE_H200 / f"{LOCAL}.json")))
              if x.startswith("VERDICT")]
    assert line.startswith("VERDICT in-process (none (each replica alone)): 400 answers "
                           "wrong where the replica's own caches served them (3k local 200 "
                           "of 200, 3k receiver-local 200 of 200); cross-replica 200/200 "
                           "exact"), line


def test_each_wrong_simple_turn_hit_one_block_more_than_the_offloading_connectors_turn(
        ) -> None:
    """Per session turn, the cached tokens of each simple-connector run against the first
    OffloadingConnector run: 16-18 of 48 turns one block (16 tokens) more, at most one
    turn less, and the wrong turn of each run among the +16 ones; the two
    OffloadingConnector runs themselves differ on 8 turns."""
    def turns(name: str) -> dict[tuple[str, int], tuple[int, str]]:
        return {(str(c.detail["session"]), i): (int(t["cached"]), str(t["text"]))
                for c in _service(read(LMCACHE_H200 / f"{name}.json"))
                if c.key.get("size") == "session" for i, t in enumerate(c.detail["turns"])}

    first = turns(NATIVE)
    assert sum(first[k][0] != v[0] for k, v in turns(NATIVE_2).items()) == 8
    for name in (SIMPLE, SIMPLE_2, SIMPLE_3):
        mine = turns(name)
        more = {k for k, v in mine.items() if v[0] - first[k][0] == 16}
        wrong = {k for k, v in mine.items() if "<miss>" in v[1]}
        assert 16 <= len(more) <= 18 and len(wrong) == 1 and wrong <= more, name
        assert sum(v[0] < first[k][0] for k, v in mine.items()) <= 1, name


def test_the_readmes_audit_cost_is_the_span_the_h200_runs_measured() -> None:
    """README.md gives the KV audit's cost as the spans its H200 runs measured: the copy
    model (hybrid: recurrent state digested too) on LMCache 0.5.6 and on 0.5.3, and the
    attention-only variant (every layer attention KV, more digests a token), apart; and
    says that the runs at the 0.5.6 span's ends shared the GPU with other runs (launched
    with ``--gpu-memory-utilization``, the setting of a run beside others)."""
    import re

    copy: dict[str, list[tuple[float, list[str]]]] = {"0.5.6": [], "0.5.3": []}
    attention_only: list[float] = []
    for path in sorted(LMCACHE_H200.glob("*.json")):
        report = read(path)
        lmcache = (report.data.get("environment") or {}).get("lmcache") or {}
        release = str(lmcache.get("version", ""))[:5]
        if release not in copy:
            continue
        settings = report.data["environment"].get("settings") or {}
        for check in checks(report, "service_regression"):
            cost = check.detail.get("cost_us_per_token") if check.key.get("size") == "audit" \
                else None
            if cost is None:
                continue
            if settings.get("model") == "/tmp/ca":  # the attention-only variant
                assert release == "0.5.6"
                attention_only.append(round(cost, 1))
            else:
                copy[release].append((round(cost, 1), list(settings.get("vllm_args") or [])))
    readme = (LMCACHE_H200.parents[2] / "README.md").read_text()
    said = re.search(r"on an H200, ([\d.]+)-([\d.]+) µs an audited token for the copy "
                     r"model on LMCache 0\.5\.6 \(both ends measured with other runs sharing "
                     r"the GPU\) and ([\d.]+)-([\d.]+) µs on 0\.5\.3 \(its 32-token prefill "
                     r"steps\), ([\d.]+) µs for the attention-only", readme)
    assert said is not None, "README.md no longer gives the audit's cost"
    low, high, low3, high3, other = map(float, said.groups())
    for (lo, hi), runs in (((low, high), copy["0.5.6"]), ((low3, high3), copy["0.5.3"])):
        costs = [c for c, _ in runs]
        assert (lo, hi) == (min(costs), max(costs)), sorted(costs)
    assert [other] == [round(c) for c in attention_only], attention_only
    for end in (low, high):
        assert all("--gpu-memory-utilization" in args for c, args in copy["0.5.6"]
                   if c == end), copy["0.5.6"]
    assert all("--max-num-batched-tokens" in args and
               args[args.index("--max-num-batched-tokens") + 1] == "32"
               for _, args in copy["0.5.3"])


SIMPLE_NO_GATE = "native-simple-vllm-0.26.0-no-gate"


def test_without_the_gate_hook_the_simple_connector_answered_the_same_turn_wrong() -> None:
    """The control (2026-12-03, ``--no-sharedkv-gate``): B's vLLM ran without the simple
    connector's gate hook (none of its variables in B's launch, the stack recorded with
    gate "off") and still answered session-00 turn 3 wrong with ``<miss>`` from the first
    word, every other step exact: the wrong turn is not the hook's. The gate's skip says
    the run proves no sensitivity, and the VERDICT says so."""
    report = read(LMCACHE_H200 / f"{SIMPLE_NO_GATE}.json")
    assert _fact(report, "stack")["gate"] == "off"
    launches = [json.loads(f["value"]) for f in report.data["facts"] if f["name"] == "launch"]
    b = next(launch for launch in launches if launch["name"] == "vllm replica B")
    assert b["env"]["VLLM_USE_SIMPLE_KV_OFFLOAD"] == "1"
    assert not [k for k in b["env"] if k.startswith("SHAREDKV_SIMPLE_GATE")]
    assert _failed(report) == ["test_session_turns[session-00-native]"]
    [message] = [r.message for r in run_log(report).tests.values() if r.outcome == "failed"]
    assert "session-00 turn 3 on B (source chunk 63): answered ' <miss> <miss>" in message
    assert _steps(report) == {"cold": (200, 200, 0, 0, 0),
                              "local": (200, 200, 601600, 0, 601600),
                              "cross": (200, 200, 0, 0, 0),
                              "receiver-local": (200, 200, 601600, 0, 601600)}
    [line] = [x for x in verdicts(_service(report)) if x.startswith("VERDICT")]
    assert line.endswith("sessions 47/48 turns, protocol 15/15; sensitivity unproven, so no "
                         "proof of integrity"), line
