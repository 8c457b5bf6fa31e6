"""The shipped replica_pair suite, end to end, on the stub provider (a test double of two
engines sharing a pool): exact answers pass; a corrupted cross-replica answer, a replica
that crashes mid-test, and bad options all fail clearly, with nothing left running."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from pytest_sharedkv.processes.managed import group_members
from tests.conftest import keep_loaded
from tests.golden import assert_golden
from tests.launch_faults import LaunchFaults, Planted, StubFaults, TransferFaults, plant
from tests.process_tags import tagged

# Loaded at import, outside any pytester snapshot: loaded inside a test, pytester's teardown
# drops them again, and lmcache's importlib_metadata then leaves later in-process runs of the
# same worker without any plugin entry point (the sharedkv plugin unloaded).
keep_loaded("torch", "lmcache")

BASE = ["--pyargs", "pytest_sharedkv.suites", "-m", "replica_pair", "-k", "cross_replica",
        "-p", "no:cacheprovider", "--sharedkv-provider=stub", "--sharedkv-settle-s=0.05"]


def _report(pytester: pytest.Pytester) -> dict[str, Any]:
    """The inner run's JSON report (--sharedkv-json=r.json)."""
    report: dict[str, Any] = json.loads((pytester.path / "r.json").read_text())
    return report


def _no_stub_left(tag: str) -> bool:
    """None of the stubs this test's run started is alive (other runs' may be)."""
    return not [p for p in tagged(tag) if "stub_openai" in p.cmdline]


@pytest.mark.golden
def test_exact_answers_from_the_shared_pool(pytester: pytest.Pytester, process_tag: str) -> None:
    """The tier's summary as a whole is its golden file (tests/data/terminal/
    replica_pair.txt: its counts, the pair's table, the run's verdict); the record holds
    what it says."""
    result = pytester.runpytest_subprocess(*BASE, "--sharedkv-json=r.json")
    result.assert_outcomes(passed=1)
    assert_golden(result.stdout.str(), "replica_pair")
    [check] = _report(pytester)["checks"]
    assert (check["key"], check["passed"], check["trials"], check["kind"], check["status"]) == (
        {"provider": "stub (test double)", "allocator": "n/a", "delay": "0"}, 3, 3, "divergence",
        "pass")
    assert check["detail"]["external_hit_tokens"] > 0
    assert all(p["b_local"] == 0 and p["b_external"] > 0 for p in check["detail"]["prompts"])
    assert _no_stub_left(process_tag)


def test_what_the_pair_launched_is_a_report_fact(pytester: pytest.Pytester) -> None:
    """Each launched process (argv, the env the suite set) and the engine settings,
    user flags included, are facts of the JSON report, once for the pair."""
    result = pytester.runpytest_subprocess(*BASE, "--sharedkv-vllm-args=--max-num-seqs 4",
                                           "--sharedkv-json=r.json")
    result.assert_outcomes(passed=1)
    facts = json.loads((pytester.path / "r.json").read_text())["facts"]
    launches = [json.loads(f["value"]) for f in facts if f["name"] == "launch"]
    assert [x["name"] for x in launches] == ["stub replica A", "stub replica B"]
    assert all("pytest_sharedkv.stack.stub.stub_openai" in x["argv"] for x in launches)
    (engine,) = [json.loads(f["value"]) for f in facts if f["name"] == "engine_settings"]
    assert engine["extra_args"] == ["--max-num-seqs", "4"] and engine["enforce_eager"]


def test_wrong_cross_replica_answer_fails_and_names_it(pytester: pytest.Pytester,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       process_tag: str) -> None:
    plant(pytester, StubFaults(corrupt_external=True))
    result = pytester.runpytest_subprocess(*BASE, "--sharedkv-json=r.json")
    result.assert_outcomes(failed=1)
    [check] = _report(pytester)["checks"]
    # 0/3 exact, each of B's answers from its pool hits (3008 a prompt), not A's answer
    assert (check["passed"], check["trials"], check["kind"], check["status"],
            check["detail"]["pair"], check["detail"]["external_hit_tokens"]) == (
        0, 3, "divergence", "fail", "stub x2 (test double)", 3 * 3008)
    assert [(p["exact"], p["b_external"], p["b_text"] != p["a_text"])
            for p in check["detail"]["prompts"]] == [(False, 3008, True)] * 3
    assert _no_stub_left(process_tag)


def test_replica_crash_mid_test_fails_with_its_log_and_no_orphan(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, process_tag: str
) -> None:
    plant(pytester, StubFaults(crash_after=1))
    result = pytester.runpytest_subprocess(*BASE, "--sharedkv-json=r.json")
    result.assert_outcomes(failed=1)
    [test] = _report(pytester)["tests"]
    lines = test["message"].splitlines()  # the failure (no record: nothing was judged)
    assert lines[0].startswith("Failed: replica B (DEAD): request failed:"), lines
    assert re.fullmatch(r"--- last lines of \S+/stub-B-\d+\.log ---", lines[1]), lines
    assert lines[-1] == "[B] crashing on purpose after 1 completions"
    assert _no_stub_left(process_tag)


def test_endpoints_must_be_two_urls(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--sharedkv-endpoints=http://a:1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --sharedkv-endpoints: needs two URLs, replica A then"
                                 " replica B (got 1)"])
    bad = pytester.runpytest("--sharedkv-provider=magic")
    bad.stderr.fnmatch_lines(["ERROR: --sharedkv-provider: 'magic' is not one of auto, vllm,*"])


def test_launched_provider_skips_without_a_gpu(pytester: pytest.Pytester,
                                               fake_gpus: Callable[[str], None]) -> None:
    result = pytester.runpytest("--pyargs", "pytest_sharedkv.suites", "-m",  # no launch
                                "replica_pair", "-k", "cross_replica",
                                "--sharedkv-provider=vllm", "--sharedkv-json=r.json")
    result.assert_outcomes(skipped=2)
    assert {t["message"].rsplit(": ", 1)[-1] for t in _report(pytester)["tests"]} == {
        "needs 1 CUDA device, 0 visible (SHAREDKV_FAKE_GPUS)"}


@pytest.mark.parametrize("tier", ["replica_pair", "perf"])
def test_transfer_provider_skips_pair_tests_with_the_real_reason(pytester: pytest.Pytester,
                                                                  tier: str) -> None:
    """--sharedkv-provider transfer: the transfer provider serves no completions (it is the
    replica_pair tier's model-free transfer check), which is why a pair test skips."""
    result = pytester.runpytest("--pyargs", "pytest_sharedkv.suites", "-m", tier, "-k",
                                "cross_replica or screening", "--sharedkv-provider=transfer",
                                "--sharedkv-json=r.json", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1)
    [test] = _report(pytester)["tests"]
    assert re.fullmatch(r"the transfer provider serves no completions: it is the "
                        r"replica_pair tier's model-free transfer check.*the tests that send "
                        r"through a pair need vllm, external or stub", test["message"]), test
    assert "not available in this version" not in result.stdout.str()


def test_provider_resolution_is_typed_and_says_when_vllm_is_missing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """auto without vllm is a state of the resolution (the launched provider, missing),
    not a provider name; the option's choices are the Provider values."""
    import importlib.util

    from pytest_sharedkv.config.options import OPTIONS, Settings
    from pytest_sharedkv.config.provider import PROVIDER_NAMES, Provider, resolve

    assert Settings().provider is Provider.AUTO
    option = next(o for o in OPTIONS if o.name == "provider")
    assert option.parse("transfer") is Provider.TRANSFER
    assert PROVIDER_NAMES == ("auto", "vllm", "transfer", "external", "stub")
    assert resolve(Provider.AUTO, ("http://a:1", "http://b:2")).provider is Provider.EXTERNAL
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    missing = resolve(Provider.AUTO, None)
    assert missing.provider is Provider.VLLM and missing.launched
    assert missing.serves_no_pair() == missing.missing and "vllm not importable" in str(
        missing.missing)
    assert resolve(Provider.STUB, None).serves_no_pair() is None


def test_group_members_sees_nothing_for_a_dead_group() -> None:
    assert group_members(999_999_999) == []


def test_transfer_judge_can_fail() -> None:
    from pytest_sharedkv.stack.checks.transfer_provider import NUM_TOKENS, judge

    store = {"stored": True, "visible_hit_tokens": NUM_TOKENS}
    good = {"hit_tokens": NUM_TOKENS, "control_hit_tokens": 0, "retrieved": True,
            "pages_compared": 256, "mismatched_pages": 0, "untouched_pages_changed": 0,
            "mismatches": []}
    assert judge(store, good) == []
    leak = {**good, "control_hit_tokens": 256}
    assert judge(store, leak) == ["a fresh cache_salt hit 256 tokens: salts do not separate "
                                  "namespaces"]
    wrong = {**good, "mismatched_pages": 3, "mismatches": [
        "layer 0, B block 7 <- A block 9: 2048 of 2048 bytes differ, first at token 0, "
        "head 0, byte 0: expected 0x12, observed 0x34"]}
    assert judge(store, wrong)[0].startswith(
        "wrong bytes: 3 of 256 retrieved page(s) differ from replica A's")
    assert judge({"stored": False}, good)[0].startswith("replica A's store did not become")


def test_transfer_score_counts_pages_and_voids_count_nothing() -> None:
    from pytest_sharedkv.stack.checks.transfer_provider import TransferOutcome, judge

    fetch = {"hit_tokens": 2048, "control_hit_tokens": 0, "retrieved": True,
             "pages_compared": 256, "mismatched_pages": 0, "untouched_pages_changed": 0}
    assert TransferOutcome(fetch=fetch).score() == (256, 256)
    wrong = {**fetch, "mismatched_pages": 64, "mismatches": ["x"]}
    store = {"stored": True, "visible_hit_tokens": 2048}
    outcome = TransferOutcome(store=store, fetch=wrong, problems=judge(store, wrong))
    assert outcome.score() == (192, 256)
    outcome.problems.insert(0, "VOID: the injected delay never ran in the LMCache server")
    assert outcome.score() == (0, 256)
    assert TransferOutcome(problems=["lmcache server exited"]).score() == (0, 1)


def test_transfer_record_kind_and_status_come_from_the_outcome() -> None:
    from pytest_sharedkv.stack.checks.transfer_provider import TransferOutcome

    assert TransferOutcome().verdict() == ("bytes", "pass")
    assert TransferOutcome(problems=["wrong bytes"]).verdict() == ("bytes", "fail")
    assert TransferOutcome(fetch={"control_hit_tokens": 256},
                           problems=["salts"]).verdict() == ("isolation", "fail")
    assert TransferOutcome(problems=["x"], void="never ran").verdict() == ("bytes", "void")


def test_transfer_matrix_adds_gpu_cells_per_allocator_and_delay() -> None:
    from pytest_sharedkv.config.options import Settings
    from pytest_sharedkv.replica_pair.fixtures import transfer_cases

    ids = [p.id for p in transfer_cases(Settings(allocators=("lazy", "mixed")))]
    assert ids == ["cpu-mixed", "cuda-lazy", "cuda-mixed"]
    ids = [p.id for p in transfer_cases(Settings(allocators=("lazy",), inject_delay=100000000))]
    assert ids == ["cpu-mixed", "cuda-lazy", "cuda-lazy-delay1e8"]


def test_transfer_locations() -> None:
    from pytest_sharedkv.stack.checks.transfer_provider import HEAD_DIM, HEADS, where

    per_token = HEADS * 2 * HEAD_DIM * 2
    assert where(0) == "token 0, head 0, byte 0"
    assert where(per_token + 2 * HEAD_DIM * 2 + 5) == "token 1, head 1, byte 5"


def test_transfer_provider_against_the_real_server(pytester: pytest.Pytester,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The inner runs are in-process (the server and both replicas are processes of their
    own, on CPU: nothing here touches a device): lmcache, which the test's gate imports, is
    loaded at this module's import (an inner run drops what it first imports, and lmcache
    does not import twice); each run then costs no interpreter start and no lmcache import."""
    pytest.importorskip("lmcache")
    args = ["--pyargs", "pytest_sharedkv.suites", "-m", "replica_pair", "-k",
            "transfer and cpu", "-p", "no:cacheprovider"]
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=1)
    off_by_one = Planted(LaunchFaults(transfer=TransferFaults(off_by_one=True)))
    wrong = pytester.runpytest(*args, "--sharedkv-json=r.json", plugins=[off_by_one])
    wrong.assert_outcomes(failed=1)
    [check] = _report(pytester)["checks"]
    fetch = check["detail"]["fetch"]
    # every page B fetched holds another block's bytes (the fault's offset), each named by
    # where the bytes first differ; no page outside the transfer changed
    assert (check["kind"], check["status"], fetch["pages_compared"], check["trials"]) == (
        "bytes", "fail", 256, 256)
    assert 0 < fetch["mismatched_pages"] == check["trials"] - check["passed"]
    assert fetch["untouched_pages_changed"] == 0
    assert all(re.match(r"layer 0, B block \d+ <- A block \d+\b.*: \d+ of 2048 bytes differ, "
                        r"first at token 0, head 0, byte 0: ", m) for m in fetch["mismatches"])
    assert check["message"].startswith(f"wrong bytes: {fetch['mismatched_pages']} of 256 "
                                       "retrieved page(s) differ from replica A's")


def test_a_failed_scrape_is_unknown_not_a_missing_hit(pytester: pytest.Pytester,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """B's 2nd metrics scrape (after its first request) fails: the round does not say B
    had no pool hits; its record says UNKNOWN."""
    plant(pytester, StubFaults(fail_metrics=(2,)))
    result = pytester.runpytest_subprocess(*BASE, "--sharedkv-json=r.json")
    result.assert_outcomes(skipped=1)
    [check] = _report(pytester)["checks"]
    assert (check["kind"], check["status"]) == ("hits-unknown", "unknown")
    assert check["message"].startswith("counters could not be read on replica B for "
                                       "prompt 0, so its pool hits are unknown"), check
    assert "status" not in check["detail"] and check["passed"] == 3
