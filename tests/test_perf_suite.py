"""The shipped perf suite, end to end, on the stub provider (a test double: OFF is two stubs
without a shared pool, ON two stubs sharing one, cold prefill simulated per token): the
default OFF-ON-ON-OFF blocks run and land in the JSON report under "perf"; a token count
that drifts between blocks is refused by name; external endpoints give one block and say
why; a bad --sharedkv-blocks is a usage error; with nothing to run on, the tier skips
with the reason.

The inner runs are in-process (the stubs are their only processes); the default screening
runs once, in a module fixture, for the tests that read it, and the tests whose assertions
count no sessions or windows run the suite with its smallest plan (SMALL_PLAN) and no
plots."""

from __future__ import annotations

import json
import re
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.perf.blocks import BlockRunner, Plan, block_arms, check_tokens
from pytest_sharedkv.perf.hits import cached_share, partial_hits, pooled_cross
from pytest_sharedkv.perf.observations import (
    STEPS,
    Observation,
    PerfRun,
    ReplicaPlacement,
    from_json,
)
from pytest_sharedkv.perf.pairing import pair_observations
from pytest_sharedkv.perf.statistics import analyse
from pytest_sharedkv.perf.tables import hit_verdict
from pytest_sharedkv.stack.launch.engine_start import starts_note
from pytest_sharedkv.stack.offload_traffic import traffic_note
from tests.conftest import isolate
from tests.golden import assert_golden
from tests.inprocess import run_inprocess
from tests.launch_faults import LaunchFaults, Planted, StubFaults
from tests.process_tags import TAG_ENV, tagged
from tests.stub_endpoints import external_stubs

# the checkout's suite (--pyargs would find the installed package's)
SUITE = str(Path(__file__).resolve().parents[1] / "suites" / "test_perf.py")
BASE = [SUITE, "-m", "perf", "-p", "no:cacheprovider", "--sharedkv-service-sizes=3k", "-rs"]
STUB = [*BASE, "--sharedkv-provider=stub"]
# The shipped runner with each phase at its smallest, for tests whose assertions read no
# session or window count: one session per placement, one window of 4 (so a warm burst
# of 4); every phase still runs in every block. The suite is copied beside it.
SMALL_PLAN = """
import dataclasses

import pytest


@pytest.fixture
def sharedkv_perf_screening(sharedkv_perf_screening):
    runner = sharedkv_perf_screening
    runner.plan = dataclasses.replace(runner.plan, sessions_per_placement=1, windows=(4,))
    return runner
"""


# For tests that read only the TTFT steps: no sessions, no windows (nor the warm burst).
TTFT_PLAN = SMALL_PLAN.replace("sessions_per_placement=1, windows=(4,)",
                               "sessions_per_placement=0, windows=()")


# TTFT_PLAN with one request of each size (of three): a 256k prompt is 262,145 words for
# the stub to hash, about 0.3 s a request whatever it finds cached.
ONE_REQUEST_PLAN = TTFT_PLAN.replace("    return runner", """\
    payloads = runner.payloads
    payloads.requests = [p for p in payloads.requests if p.id.endswith("-00")]
    runner.run_record.corpus_digest = payloads.digest
    return runner""")


def small_plan(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
               plan: str = SMALL_PLAN) -> list[str]:
    """BASE's arguments for the shipped suite run in-process with PLAN (SMALL_PLAN unless
    given) and without the plots (matplotlib hidden: drawing them took 4 s a run; the
    default run draws them)."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    pytester.makeconftest(plan)
    (pytester.path / "test_perf.py").write_text(Path(SUITE).read_text())
    return ["test_perf.py", *BASE[1:]]


@dataclass(frozen=True)
class StubRun:
    result: pytest.RunResult
    run: PerfRun
    tag: str  # the process tag the run's processes carried
    perf: dict[str, Any]  # the JSON report's "perf", as written
    junit: str  # the run's --junitxml report
    path: Path  # where it ran
    notes: list[str]  # the JSON report's notes (the tier's lines)


# Where the plots go, or why none were drawn (matplotlib is an extra).
PLOTS = ((re.compile(r"^  (plots: .*|no plots: .*)$"), "  <plots>"),)


@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
                ) -> StubRun:
    """The default OFF-ON-ON-OFF screening on the stub, with user flags for vllm (recorded
    only), run once for the module's tests that read it (in-process: the stub pair are its
    only processes), in an environment of its own (set up before the autouse isolation)."""
    path = tmp_path_factory.mktemp("default-screening")
    tag = uuid.uuid4().hex
    with pytest.MonkeyPatch.context() as monkeypatch:
        isolate(monkeypatch, pytestconfig, tmp_path_factory)
        monkeypatch.setenv(TAG_ENV, tag)
        result = run_inprocess(path, tmp_path_factory.mktemp("default-screening-tmp"), *STUB,
                               "--sharedkv-json=r.json", "--junitxml=j.xml",
                               "--sharedkv-vllm-args=--max-num-seqs 8 --x 'a b'")
    report = json.loads((path / "r.json").read_text())
    return StubRun(result, from_json(report["perf"]), tag, report["perf"],
                   (path / "j.xml").read_text(), path,
                   [n["text"] for n in report["notes"]])


def _shares(run: PerfRun, step: str) -> dict[str, float | None]:
    """Each arm's median share of STEP's prompts served from a cache (perf.hits), rounded."""
    out = {}
    for arm in dict.fromkeys(run.blocks):
        share = cached_share(o for o in run.observations
                             if (o.arm, o.step) == (arm, step) and not o.warmup)
        out[arm] = None if share is None else round(share, 2)
    return out


@pytest.mark.golden
def test_default_blocks_on_the_stub(default_run: StubRun) -> None:
    """The tier's summary as a whole is its golden file (tests/data/terminal/perf.txt: its
    notes, the TTFT, ratio, session and decode tables, every verdict); the report holds the
    blocks, every observation and session, the notes, and the plots are drawn."""
    result, run = default_run.result, default_run.run
    result.assert_outcomes(passed=1)
    assert_golden(result.stdout.str(), "perf", PLOTS)
    assert "no floor: the stub provider is a test double (no GPU, no KV to move)" in run.notes
    # what the tier's cache-hit note says, from the observations: the pool serves B's cross
    # step in ON only, A's repeat and B's own repeat in both
    assert {step: _shares(run, step) for step in STEPS} == {
        "cold": {"OFF": 0.0, "ON": 0.0}, "local": {"OFF": 1.0, "ON": 1.0},
        "cross": {"OFF": 0.0, "ON": 1.0}, "receiver-local": {"OFF": 1.0, "ON": 1.0}}
    # the one run of this file that draws the plots (the others hide matplotlib)
    plots = [default_run.path / f"r-perf-{name}.png" for name in ("ttft", "sessions")]
    assert all(p.is_file() for p in plots) == bool(find_spec("matplotlib"))
    assert run.blocks == ["OFF", "ON", "ON", "OFF"] and run.block_pairs == [0, 0, 1, 1]
    assert len(run.restarts_s) == 4 and run.floor is None and run.wall_s > 0
    assert run.engine["provider"] == "stub (test double)"
    measured = [o for o in run.observations if not o.warmup]
    for block, arm in enumerate(run.blocks):
        mine = [o for o in measured if o.block == block]
        assert {o.arm for o in mine} == {arm} and {o.pair for o in mine} == {block // 2}
        for step in STEPS:
            cell = [o for o in mine if o.step == step]
            assert len(cell) == 3 and {o.size for o in cell} == {"3k"}
            assert {o.replica for o in cell} == {"A" if step in ("cold", "local") else "B"}
            assert all(o.prompt_tokens == 3073 and o.output_tokens == 8 for o in cell)
            assert all(0 < o.ttft_s <= o.e2e_s and o.decode_tok_s for o in cell)
        warm = [o for o in run.observations if o.warmup and o.block == block]
        assert len(warm) == 4 + 8  # 2 payloads on A and B, then a burst of 8 at once
        assert sum(o.request.endswith(tuple(f'/burst-{i}' for i in range(8)))
                   for o in warm) == 8
        sessions = [s for s in run.sessions if s.block == block]
        assert sorted((s.placement, s.session.split("/")[0]) for s in sessions
                      if "/" in s.session) == [("window-4", "w4")] * 4 + [
            ("window-8", "w8")] * 8
        plain = [s for s in sessions if "/" not in s.session]
        assert sorted(s.placement for s in plain) == ["alternating"] * 2 + ["fixed"] * 2
        assert all(s.turns == 6 and s.wall_s > 0 for s in sessions)
    assert pair_observations(run.observations, run.blocks).ok
    assert not [p for p in tagged(default_run.tag) if "stub_openai" in p.cmdline]


def test_junitxml_names_where_the_screening_is_and_holds_none_of_it(
        default_run: StubRun) -> None:
    """CI keeps a --junitxml report: it gets the JSON report's path and the screening's
    digest, which is the digest of what the JSON report holds under "perf"."""
    from xml.etree import ElementTree

    from pytest_sharedkv.perf.fixtures import screening_digest

    properties = [p.attrib for p in ElementTree.fromstring(default_run.junit).iter("property")]
    [where] = [p["value"] for p in properties if p["name"] == "sharedkv_perf"]
    digest, report = where.split(" in ")  # the report's path, made absolute at configure
    assert digest == f"sha256:{screening_digest(default_run.perf)}"
    assert Path(report).is_absolute() and Path(report).name == "r.json"
    assert default_run.perf["observations"] and '"observations"' not in default_run.junit
    assert len(default_run.junit) < 20_000  # the check records, not the screening


def test_the_engine_settings_and_every_launch_are_recorded(default_run: StubRun) -> None:
    """The perf arms' engine settings (CUDA graphs, the user's --sharedkv-vllm-args) and
    each block's launched processes (argv, the environment the suite set) land in the
    PerfRun, with the served model's weights and compute; on the stub double."""
    result, run = default_run.result, default_run.run
    result.assert_outcomes(passed=1)
    assert (run.model["kind"], run.model["weights"]) == ("stub (test double)", "none")
    assert run.engine_settings["enforce_eager"] is False
    assert run.engine_settings["extra_args"] == ["--max-num-seqs", "8", "--x", "a b"]
    assert [x["arm"] for x in run.launches] == ["OFF", "ON", "ON", "OFF"]
    for block in run.launches:
        names = [p["name"] for p in block["processes"]]
        assert names == ["stub replica A", "stub replica B"]
        assert all("pytest_sharedkv.stack.stub.stub_openai" in p["argv"]
                   for p in block["processes"])
        # each block's start: the restart the screening timed, each process's ready time
        assert block["restart_s"] > 0 and set(block["start"]) == set(names)
        assert all(0 < p["ready"] <= block["restart_s"] for p in block["start"].values())
    assert [x["restart_s"] for x in run.launches] == run.restarts_s
    assert run.model["kind"] == "stub (test double)"
    # the stub double runs on no GPU: its placement says so, no devices invented
    assert run.replica_placement == ReplicaPlacement(None, {})
    # each block's engine starts, as the report's line gives them (stack.engine_start)
    assert starts_note(run.launches) in default_run.notes


# A screening whose ON block served one token more for one request (no replicas run).
DRIFT_CONFTEST = """
import pytest
from pytest_sharedkv.perf.blocks import BlockRunner, Plan
from pytest_sharedkv.perf.observations import Observation
from pytest_sharedkv.perf.payloads import Payload, PayloadSet


class Drifting(BlockRunner):
    def _blocks(self):
        for block, arm in enumerate(self.plan.arms):
            for step, replica in (("cold", "A"), ("cross", "B")):
                tokens = 3074 if (arm, step) == ("ON", "cross") else 3073
                self.run_record.observations.append(Observation(
                    arm, block, 0, "3k", step, "3k-01", "ab" * 32, replica, tokens, 8, 0.1,
                    None, 0.2))


@pytest.fixture
def sharedkv_perf_screening():
    payloads = PayloadSet("words", [Payload("3k-01", "3k", "w01", "ab" * 32, 3073)], [], [],
                          "canned")
    return Drifting(lambda arm: None, payloads, Plan(arms=("OFF", "ON"), provider="stub"),
                    str, model_digest="canned", engine={})
"""


def test_a_token_count_that_drifts_is_refused_by_name(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # no plots: 2 s, none asserted
    pytester.makeconftest(DRIFT_CONFTEST)
    (pytester.path / "test_perf.py").write_text(Path(SUITE).read_text())
    result = pytester.runpytest("-p", "no:cacheprovider", "--sharedkv-json=r.json")
    result.assert_outcomes(failed=1)
    report = json.loads((pytester.path / "r.json").read_text())
    run = from_json(report["perf"])  # kept for reading
    # what the tier refused, as it reads the kept observations against the payload
    from pytest_sharedkv.perf.pairing import pair_run
    from pytest_sharedkv.perf.payloads import Payload, PayloadSet

    payloads = PayloadSet("words", [Payload("3k-01", "3k", "w01", "ab" * 32, 3073)], [], [],
                          "canned")
    refused = [*check_tokens(run.observations, payloads),
               *(str(r) for r in pair_run(run).refusals)]
    assert refused[:3] == [
        "request 3k-01 (block 1, arm ON, cross on B): served 3074 prompt tokens, its payload "
        "has 3073 (payload sha256 abababababababab)",
        "request 3k-01: 3074 prompt tokens in block 1 (ON, cross) but 3073 in block 0 (OFF, "
        "cold)",
        "request 3k-01 (block 1, arm ON, pair 0): token counts differ across arms (3k cross on"
        " replica B): prompt_tokens 3074 in block 1 (ON) but 3073 in block 0 (OFF)"]
    [test] = report["tests"]
    assert (test["outcome"], len(refused)) == ("failed", 4)
    assert test["message"].startswith("Failed: 4 observation(s) refused:")


def _observation(block: int, tokens: int, step: str = "cold") -> Observation:
    return Observation(arm=block_arms(1)[block], block=block, pair=0, size="3k", step=step,
                       request="3k-00", payload_sha256="ab" * 32, replica="A",
                       prompt_tokens=tokens, output_tokens=8, ttft_s=0.1, decode_tok_s=None,
                       e2e_s=0.2)


def test_token_checks_and_block_order() -> None:
    from pytest_sharedkv.perf.payloads import Payload, PayloadSet

    payloads = PayloadSet("words", [Payload("3k-00", "3k", "w01", "ab" * 32, 3009)], [], [],
                          "test")
    assert check_tokens([_observation(0, 3009), _observation(1, 3009)], payloads) == []
    assert check_tokens([_observation(0, 3009), _observation(1, 3000)], payloads) == [
        "request 3k-00 (block 1, arm ON, cold on A): served 3000 prompt tokens, its payload "
        "has 3009 (payload sha256 abababababababab)",
        "request 3k-00: 3000 prompt tokens in block 1 (ON, cold) but 3009 in block 0 (OFF, "
        "cold)"]
    assert block_arms(1) == ("OFF", "ON")
    assert block_arms(2) == ("OFF", "ON", "ON", "OFF")
    assert block_arms(3) == ("OFF", "ON", "ON", "OFF", "OFF", "ON")
    assert block_arms(2, ("ON", "NATIVE")) == ("OFF", "ON", "NATIVE", "NATIVE", "ON", "OFF")
    assert block_arms(2, ("NATIVE",)) == ("OFF", "NATIVE", "NATIVE", "OFF")
    for bad in ((), ("OFF",), ("ON", "ON")):
        with pytest.raises(ValueError, match="treatment arms must be distinct"):
            block_arms(1, bad)


class _Order(BlockRunner):
    """Records each request's (step, request) and each settle instead of sending them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[tuple[str, str]] = []

    def _restart(self, arm: str) -> None:
        pass

    def _settle(self, tokens: int) -> None:
        self.sent.append(("settle", str(tokens)))

    def _request(self, block: int, arm: str, step: str, replica: str, payload: Any,
                 request: str, warmup: bool = False, salt_key: str | None = None) -> None:
        self.sent.append((step, request))


def test_a_size_the_pool_cannot_hold_together_runs_request_by_request() -> None:
    """8k: every cold, every local, one settle, every cross; 128k (in one_by_one): each
    request's cold, local, settle, cross and receiver-local before the next one's cold."""
    from pytest_sharedkv.perf.payloads import Payload, PayloadSet

    requests = [Payload(f"{size}-{i}", size, "w", "ab" * 32, n)
                for size, n in (("8k", 10), ("128k", 100)) for i in range(2)]
    runner = _Order(lambda arm: None, PayloadSet("words", requests, [], [], "test"),
                    Plan(arms=("ON",), provider="stub", windows=(), sessions_per_placement=0,
                         one_by_one=frozenset({"128k"})), str, model_digest="t", engine={})
    runner.run()  # the public face: the blocks, then the checks of what was sent
    steps = [f"{a}:{b}" for a, b in runner.sent]
    assert steps == [
        "cold:8k-0", "cold:8k-1", "local:8k-0", "local:8k-1", "settle:20", "cross:8k-0",
        "cross:8k-1", "receiver-local:8k-0", "receiver-local:8k-1",
        "cold:128k-0", "local:128k-0", "settle:100", "cross:128k-0", "receiver-local:128k-0",
        "cold:128k-1", "local:128k-1", "settle:100", "cross:128k-1", "receiver-local:128k-1"]


@pytest.mark.parametrize(("value", "problem"), [
    ("0", "'0' is out of range; it takes a whole number from 1 to 20"),
    ("21", "'21' is out of range; it takes a whole number from 1 to 20"),
    ("two", "'two' is not a whole number; it takes a whole number from 1 to 20"),
])
def test_a_bad_block_count_is_a_usage_error(pytester: pytest.Pytester, value: str,
                                            problem: str) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(f"--sharedkv-blocks={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --sharedkv-blocks: {problem}"])


def test_the_tier_skips_with_the_reason_when_nothing_can_run(
        pytester: pytest.Pytester, fake_gpus: Callable[[str], None]) -> None:
    result = pytester.runpytest(*BASE, "--sharedkv-json=r.json")  # skips before any launch
    result.assert_outcomes(skipped=1)
    [test] = json.loads((pytester.path / "r.json").read_text())["tests"]
    assert (test["outcome"], test["message"]) == (
        "skipped", "needs 1 CUDA device, 0 visible (SHAREDKV_FAKE_GPUS)")


@pytest.fixture
def stub_endpoints() -> Iterator[str]:
    """Two stubs without a shared pool (an external pair as the suite cannot know it)."""
    with external_stubs() as urls:
        yield urls


def test_external_endpoints_give_one_block_and_say_why(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, stub_endpoints: str
) -> None:
    result = pytester.runpytest(*small_plan(pytester, monkeypatch),
                                f"--sharedkv-endpoints={stub_endpoints}",
                                "--sharedkv-settle-s=0.01", "--sharedkv-json=r.json")
    result.assert_outcomes(skipped=1)
    report = json.loads((pytester.path / "r.json").read_text())
    [test] = report["tests"]
    assert (test["outcome"], test["message"]) == (
        "skipped", "external endpoints: one block as deployed was measured and reported; the "
        "OFF-ON-ON-OFF blocks need replica restarts into each arm, which the suite cannot do "
        "to an external deployment")
    run = from_json(report["perf"])
    assert run.blocks == ["ON"] and run.restarts_s == []
    assert {o.step for o in run.observations} == set(STEPS)
    assert any(n.startswith("no floor: external endpoints") for n in run.notes)
    assert run.replica_placement == ReplicaPlacement(None, {})  # no engine of the suite's


def test_a_replica_that_dies_mid_screening_keeps_what_was_measured(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing is lost: B dies on its 10th request (after 2 warm-ups, 4 of the burst, 3 cross
    requests), the test fails naming the phase, and the observations made so far are in
    the JSON report with an INCOMPLETE note; the progress lines say where time went."""
    crash = Planted(LaunchFaults(stub=StubFaults(crash_after=9)))
    result = pytester.runpytest(*STUB, "--sharedkv-json=r.json", plugins=[crash])
    result.assert_outcomes(failed=1)
    # the phase's seconds are in its progress line alone
    result.stdout.fnmatch_lines(["*block 0 (OFF) 3k cross: 3 requests, * s*"])
    run = from_json(json.loads((pytester.path / "r.json").read_text())["perf"])
    assert [n for n in run.notes if n.startswith("INCOMPLETE: the screening stopped in "
                                                 "block 0 (OFF), 3k receiver-local after ")]
    steps = [o.step for o in run.observations if not o.warmup]
    assert steps == ["cold"] * 3 + ["local"] * 3 + ["cross"] * 3
    assert run.wall_s > 0


def test_the_native_arm_is_a_third_block_of_every_pair(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """--sharedkv-native-arm: OFF-ON-NATIVE per pair; on the stub NATIVE keeps a pool per
    replica (as vLLM's own offloading does), so B's cross step finds nothing of A's, and
    both treatments pair with OFF."""
    result = pytester.runpytest(*small_plan(pytester, monkeypatch), "--sharedkv-provider=stub",
                                "--sharedkv-json=r.json", "--sharedkv-blocks=1",
                                "--sharedkv-native-arm")
    result.assert_outcomes(passed=1)
    # the block's seconds are in its progress line alone
    result.stdout.fnmatch_lines(["*block 2 (NATIVE) done in * s*"])
    run = from_json(json.loads((pytester.path / "r.json").read_text())["perf"])
    assert run.blocks == ["OFF", "ON", "NATIVE"] and run.block_pairs == [0, 0, 0]
    assert _shares(run, "cross") == {"OFF": 0.0, "ON": 1.0, "NATIVE": 0.0}
    assert sorted({s.placement for s in run.sessions}) == ["alternating", "fixed", "window-4"]
    assert {o.pair for o in run.observations} == {0}
    pairing = pair_observations(run.observations, run.blocks)
    assert pairing.ok
    assert {p.arms for p in pairing.pairs} == {"ON/OFF", "NATIVE/OFF"}


def test_native_alone_is_screened_against_off(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """--sharedkv-perf-arms NATIVE: a pair is OFF-NATIVE (no ON block, so it fits where
    three blocks would not); on the stub each NATIVE replica keeps a pool of its own, so
    B's cross step finds nothing of A's, and NATIVE pairs with OFF."""
    result = pytester.runpytest(*small_plan(pytester, monkeypatch, TTFT_PLAN),
                                "--sharedkv-provider=stub", "--sharedkv-json=r.json",
                                "--sharedkv-blocks=1", "--sharedkv-perf-arms=NATIVE")
    result.assert_outcomes(passed=1)
    report = json.loads((pytester.path / "r.json").read_text())
    run = from_json(report["perf"])
    assert run.blocks == ["OFF", "NATIVE"] and run.block_pairs == [0, 0]
    assert {o.size for o in run.observations} == {"3k"}
    assert _shares(run, "cross") == {"OFF": 0.0, "NATIVE": 0.0}
    analysis = analyse(run)
    assert [(r.size, r.arms) for r in analysis.ratios if r.step == "cross"] == [
        ("3k", "NATIVE/OFF")]
    assert hit_verdict(analysis) is None  # no ON arm: no pool hits to judge
    pools = [next((Path(a).name for a in p["argv"] if "stub-pool" in a), None)
             for x in run.launches for p in x["processes"]]
    assert pools == [None, None, "stub-pool-A", "stub-pool-B"]  # OFF none; NATIVE its own
    pairing = pair_observations(run.observations, run.blocks, run.block_pairs)
    assert pairing.ok and {p.arms for p in pairing.pairs} == {"NATIVE/OFF"}
    # what each NATIVE replica stored to its own tier, from its log; nothing read back
    assert "offload" not in run.launches[0]  # OFF offloads nothing: unknown, not 0
    traffic = run.launches[1]["offload"]
    assert set(traffic) == {"stub replica A", "stub replica B"}
    assert all(t["stored_bytes"] > 0 and t["loaded_bytes"] == 0 for t in traffic.values())
    assert traffic_note(run.launches) in {n["text"] for n in report["notes"]}


def test_256k_is_screened_on_the_stub(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """--sharedkv-perf-sizes 8k,256k over BASE's --sharedkv-service-sizes 3k: a 256k prompt
    (262,145 tokens at the stub's 64-token chunk) runs every step in one block pair, pairs
    with OFF, is a full pool hit across replicas, and sorts after 8k in the verdict (one
    request a size, the stub's simulated prefill at 1 us a token: seconds, not a minute)."""
    from pytest_sharedkv.perf import fixtures

    monkeypatch.setattr(fixtures, "STUB_PREFILL_US", 1.0)
    result = pytester.runpytest(*small_plan(pytester, monkeypatch, ONE_REQUEST_PLAN),
                                "--sharedkv-provider=stub", "--sharedkv-json=r.json",
                                "--sharedkv-blocks=1", "--sharedkv-perf-sizes=8k,256k")
    result.assert_outcomes(passed=1)
    run = from_json(json.loads((pytester.path / "r.json").read_text())["perf"])
    assert run.blocks == ["OFF", "ON"]
    assert [(r.size, r.arms) for r in analyse(run).ratios if r.step == "cross"] == [
        ("8k", "ON/OFF"), ("256k", "ON/OFF")]
    big = [o for o in run.observations if o.size == "256k" and not o.warmup]
    assert {(o.arm, o.step) for o in big} == {(a, s) for a in ("OFF", "ON") for s in STEPS}
    assert {o.prompt_tokens for o in big} == {262_145}
    assert all(o.cached_tokens == 262_144 for o in big if (o.arm, o.step) == ("ON", "cross"))
    assert pair_observations(run.observations, run.blocks, run.block_pairs).ok


def test_a_pool_too_small_marks_the_cross_hits_partial(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The H200 screening's fault, on the stub: a pool that holds fewer blocks than one
    size's requests store evicts them before B asks, so B recomputes part of each
    cross-replica prompt. The tier marks those requests PARTIAL and does not judge their
    size's cross ratio, instead of timing a recompute as a transfer."""
    small = Planted(LaunchFaults(stub=StubFaults(pool_blocks=100)))  # a 3k prompt: 48 blocks
    result = pytester.runpytest(*small_plan(pytester, monkeypatch), "--sharedkv-provider=stub",
                                "--sharedkv-json=r.json", "--sharedkv-blocks=1", plugins=[small])
    result.assert_outcomes(passed=1)
    run = from_json(json.loads((pytester.path / "r.json").read_text())["perf"])
    assert run.chunk_tokens == 64
    cross = [o for o in run.observations if (o.arm, o.step) == ("ON", "cross")]
    assert cross and all(o.cached_tokens is not None for o in cross)
    assert min(o.cached_tokens or 0 for o in cross) < 3072
    # the tier's reading of them: partial pool hits (so 3k's cross ratio goes unjudged)
    partial = partial_hits(run.observations, run.chunk_tokens)
    assert partial and {(o.size, o.arm, o.step) for o in partial} == {("3k", "ON", "cross")}
    assert len(pooled_cross(run.observations)) == 3


def test_a_screening_ended_by_sigterm_keeps_what_it_measured(
        pytester: pytest.Pytester) -> None:
    """Nothing is lost to an interrupt either: SIGTERM mid-screening ends the test before
    its call report, yet the JSON report holds the observations made so far with the
    INCOMPLETE note, and says the run was interrupted."""
    import os
    import signal
    import subprocess
    import sys
    import time

    log_path = pytester.path / "run.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONUNBUFFERED"] = "1"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "pytest", *STUB, "--sharedkv-json=r.json"],
                                cwd=pytester.path, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while "3k cold: 3 requests" not in log_path.read_text(errors="replace"):
                assert proc.poll() is None and time.monotonic() < deadline, \
                    log_path.read_text(errors="replace")[-2000:]
                time.sleep(0.1)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["interrupted"] and "SIGTERM" in report["interrupted"]
    assert report["summary"]["passed"] == 0
    run = from_json(report["perf"])
    assert [n for n in run.notes if n.startswith("INCOMPLETE: the screening stopped in ")]
    assert [o.step for o in run.observations if not o.warmup][:3] == ["cold"] * 3


def test_the_screening_reaches_the_controller_as_a_report_attribute() -> None:
    """What xdist does with a worker's report (to JSON and back) keeps the screening, and
    the run log reads it from there; user_properties hold only its reference."""
    from pytest_sharedkv.report.fields import PERF_ATTRIBUTE, PERF_PROPERTY
    from pytest_sharedkv.report.run_log import RunLog

    screening: dict[str, Any] = {"schema": "x",
                                 "observations": [{"ttft_s": 0.25, "step": "cold"}]}
    report = pytest.TestReport("t.py::test_screening", ("t.py", 1, "test_screening"), {},
                               "passed", None, "call",
                               user_properties=[(PERF_PROPERTY, "sha256:ab in r.json")])
    setattr(report, PERF_ATTRIBUTE, screening)
    moved = pytest.TestReport._from_json(report._to_json())
    log = RunLog()
    log.add_report(moved, "passed")
    assert log.perf == screening
