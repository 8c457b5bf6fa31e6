"""``python -m pytest_sharedkv compare BEFORE AFTER``: exit 0 for the same report, 1 for a
cell slower than --max-regression beyond the noise of its block pairs or any correctness
difference (new ones first, by test id), 2 for reports that do not compare or bad input,
with one line and no traceback. Two real H200 runs of the same software (an A/A pair)
do not fail it.

The exit codes are checked through the real command line; the finer cases in-process."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.cli.compare.main import main, max_regression
from pytest_sharedkv.cli.compare.speed import Change, Stat, Verdict, regressions
from pytest_sharedkv.perf.observations import PerfRun, from_json, to_json
from tests.perf_arms import with_native_pair

ROOT = Path(__file__).resolve().parents[1]
SCREENING = ROOT / "fixtures" / "perf" / "screening.json"
GATE = "suites/test_service_regression.py::test_sensitivity_gate[mixed]"
CHAIN = "suites/test_service_regression.py::test_request_chain[mixed-8k-0]"


@pytest.fixture(scope="module")
def baseline() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(SCREENING.read_text())
    return data


def write(directory: Path, name: str, data: dict[str, Any]) -> Path:
    path = directory / name
    path.write_text(json.dumps(data))
    return path


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "pytest_sharedkv", "compare",
                           *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def slower(data: dict[str, Any], factor: float, size: str = "8k", arm: str = "ON",
           step: str = "cross") -> dict[str, Any]:
    out = copy.deepcopy(data)
    for o in out["perf"]["observations"]:
        if (o["size"], o["arm"], o["step"]) == (size, arm, step):
            o["ttft_s"] *= factor
    return out


def failing(data: dict[str, Any], nodeid: str, message: str = "boom") -> dict[str, Any]:
    out = copy.deepcopy(data)
    for test in out["tests"]:
        if test["nodeid"] == nodeid:
            test["outcome"], test["message"] = "failed", message
    return out


def test_identical_reports_exit_0(tmp_path: Path, baseline: dict[str, Any]) -> None:
    out = cli(SCREENING, write(tmp_path, "after.json", baseline))
    assert out.returncode == 0, out.stderr
    assert "RESULT: OK" in out.stdout and "| 128k | ON  | cross" in out.stdout
    assert out.stderr == ""


def test_a_cell_20_percent_slower_is_a_regression(tmp_path: Path,
                                                  baseline: dict[str, Any]) -> None:
    after = write(tmp_path, "after.json", slower(baseline, 1.2))
    out = cli(SCREENING, after, "--max-regression", "10%")
    assert out.returncode == 1, out.stderr
    (row,) = [line for line in out.stdout.splitlines() if "REGRESSION" in line]
    assert row.startswith("| 8k   | ON  | cross") and "+20.0%" in row
    assert "(n=6, 3 pairs)" in row
    assert "RESULT: FAIL: 1 significant regression(s) beyond 10%" in out.stdout
    assert main([str(SCREENING), str(after), "--max-regression", "0.25"]) == 0


def test_a_new_failed_test_fails_and_is_listed_first(tmp_path: Path,
                                                     baseline: dict[str, Any]) -> None:
    before = write(tmp_path, "before.json", failing(baseline, GATE, "old failure"))
    after = write(tmp_path, "after.json",
                  failing(failing(baseline, GATE, "old failure"), CHAIN, "new failure"))
    out = cli(before, after)
    assert out.returncode == 1, out.stderr
    rows = [line for line in out.stdout.splitlines() if "| failed" in line]
    assert len(rows) == 2
    assert rows[0].startswith("| NEW") and CHAIN in rows[0] and "new failure" in rows[0]
    assert rows[1].startswith("| also in BEFORE") and GATE in rows[1]
    correctness = out.stdout.index("## Correctness")
    assert correctness < out.stdout.index("## Performance")


def test_a_different_model_digest_does_not_compare(tmp_path: Path,
                                                   baseline: dict[str, Any]) -> None:
    other = copy.deepcopy(baseline)
    other["perf"]["model_digest"] = "ffff0000ffff0000"
    out = cli(SCREENING, write(tmp_path, "after.json", other))
    assert out.returncode == 2
    assert out.stdout == ""
    assert ("incomparable reports: model digest differs: BEFORE "
            "'27b-geometry-0000000000000000', AFTER 'ffff0000ffff0000'") in out.stderr


def test_a_bad_max_regression_is_a_usage_error(tmp_path: Path) -> None:
    out = cli(SCREENING, SCREENING, "--max-regression", "ten")
    assert out.returncode == 2
    assert "argument --max-regression: 'ten' is not a percentage" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    out = cli(SCREENING, missing)
    assert out.returncode == 2
    assert out.stderr.strip() == f"python -m pytest_sharedkv compare: {missing}: no such file"


# --- in-process ---------------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    status = main([str(a) for a in args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.parametrize(("text", "value"), [("10%", 0.10), ("0.1", 0.1), ("2.5%", 0.025),
                                             ("150%", 1.5), ("0", 0.0)])
def test_max_regression_values(text: str, value: float) -> None:
    assert max_regression(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["ten", "-5%", "10", "nan", "%"])
def test_bad_max_regression_values(capsys: pytest.CaptureFixture[str], text: str) -> None:
    status, out, err = run(capsys, SCREENING, SCREENING, f"--max-regression={text}")
    assert status == 2 and out == ""
    assert "argument --max-regression:" in err


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "not valid JSON (line 1, column 2"),
    ("[1, 2]", "not a sharedkv JSON report (the top level is a list"),
    ('{"schema": "pytest-sharedkv/1", "perf": {"schema": "x"}}',
     "perf.schema: 'x' is not 'pytest-sharedkv-perf/1'"),
])
def test_bad_files_are_named(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                             content: str, message: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    status, out, err = run(capsys, SCREENING, bad)
    assert status == 2 and out == ""
    assert err.startswith(f"python -m pytest_sharedkv compare: {bad}: {message}")
    assert len(err.strip().splitlines()) == 1


def test_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(capsys, SCREENING)
    assert status == 2 and "the following arguments are required: AFTER.json" in err
    assert "usage: python -m pytest_sharedkv compare" in err


@pytest.mark.parametrize(("where", "value", "what"), [
    ("schema", "pytest-sharedkv/2", "schema differs: BEFORE 'pytest-sharedkv/1', AFTER "
                                    "'pytest-sharedkv/2'"),
    ("corpus_digest", "other", "corpus digest differs"),
    ("perf", None, "BEFORE holds a perf screening and AFTER none"),
])
def test_reports_that_do_not_compare(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                     baseline: dict[str, Any], where: str, value: Any,
                                     what: str) -> None:
    other = copy.deepcopy(baseline)
    if where == "corpus_digest":
        other["perf"][where] = value
    else:
        other[where] = value
    status, _, err = run(capsys, SCREENING, write(tmp_path, "after.json", other))
    assert status == 2
    assert f"incomparable reports: {what}" in err


def test_a_test_that_passed_before_and_skips_after_is_lost(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, baseline: dict[str, Any]) -> None:
    after = copy.deepcopy(baseline)
    after["tests"][1].update(outcome="skipped", message="vllm not installed")
    del after["tests"][0]
    status, out, _ = run(capsys, SCREENING, write(tmp_path, "after.json", after))
    assert status == 1
    lost = [line for line in out.splitlines() if "| lost" in line]
    assert len(lost) == 2
    assert GATE in lost[0] and "passed in BEFORE, not in AFTER" in lost[0]
    assert CHAIN in lost[1] and "passed in BEFORE, skipped in AFTER: vllm not installed" \
        in lost[1]


def test_an_interrupted_after_or_a_refused_pairing_fails(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, baseline: dict[str, Any]) -> None:
    interrupted = copy.deepcopy(baseline)
    interrupted.update(complete=False, interrupted="KeyboardInterrupt")
    status, out, _ = run(capsys, SCREENING, write(tmp_path, "a.json", interrupted))
    assert status == 1 and "| interrupted" in out and "INCOMPLETE" in out
    refused = copy.deepcopy(baseline)
    refused["perf"]["observations"][1]["output_tokens"] = 3
    status, out, _ = run(capsys, SCREENING, write(tmp_path, "b.json", refused))
    assert status == 1 and "perf pairing refused" in out and "output_tokens" in out


def test_a_missing_cell_fails_and_the_markdown_file_is_written(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, baseline: dict[str, Any]) -> None:
    after = copy.deepcopy(baseline)
    after["perf"]["observations"] = [o for o in after["perf"]["observations"]
                                     if o["size"] != "128k"]
    after["perf"]["sessions"] = []
    markdown = tmp_path / "out.md"
    status, out, _ = run(capsys, SCREENING, write(tmp_path, "after.json", after),
                         "--markdown", markdown)
    assert status == 1
    assert markdown.read_text() == out
    assert out.count("MISSING in AFTER") == 1 + 8 + 4  # RESULT; 2 arms x 4 steps, x 2 places
    assert "RESULT: FAIL: 12 cell(s) MISSING in AFTER" in out
    status, _, err = run(capsys, SCREENING, SCREENING, "--markdown", tmp_path)
    assert status == 2 and f"--markdown: cannot write {tmp_path}" in err


def with_arms(data: dict[str, Any], shape: Callable[[PerfRun], PerfRun]) -> dict[str, Any]:
    """DATA with its screening reshaped (tests.perf_arms: NATIVE in some pairs)."""
    out = copy.deepcopy(data)
    out["perf"] = to_json(shape(from_json(out["perf"])))
    return out


def test_arms_only_one_side_screened_are_named_not_missing(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, baseline: dict[str, Any]) -> None:
    """BEFORE three OFF-ON pairs and one OFF-NATIVE pair (a merge), AFTER OFF-ON only: the
    arms both ran are compared, NATIVE is named as BEFORE's alone, and nothing is MISSING;
    the other way round it is AFTER's alone."""
    merged = write(tmp_path, "merged.json", with_arms(baseline, with_native_pair))
    status, out, _ = run(capsys, merged, SCREENING)
    assert status == 0, out
    assert ("ARMS DIFFER: NATIVE only in BEFORE (1 block pair): their cells are not "
            "compared; judged: the arms both screened (OFF, ON)") in out
    assert "MISSING" not in out and "| NATIVE" not in out and "| 8k   | ON  | cross" in out
    status, out, _ = run(capsys, SCREENING, merged)
    assert status == 0 and "ARMS DIFFER: NATIVE only in AFTER (1 block pair)" in out
    status, out, _ = run(capsys, SCREENING, SCREENING)
    assert "ARMS DIFFER" not in out


def test_a_shared_arm_is_judged_beside_an_arm_one_side_alone_ran(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, baseline: dict[str, Any]) -> None:
    """ON 20% slower in AFTER, which also screened NATIVE: ON's cell is still a regression
    over its three block pairs a side."""
    after = write(tmp_path, "after.json", with_arms(slower(baseline, 1.2), with_native_pair))
    status, out, _ = run(capsys, SCREENING, after)
    assert status == 1
    (row,) = [line for line in out.splitlines() if "REGRESSION" in line]
    assert row.startswith("| 8k   | ON  | cross") and row.count("(n=6, 3 pairs)") == 2
    assert "ARMS DIFFER: NATIVE only in AFTER" in out


def test_reports_without_perf_compare_correctness_only(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, baseline: dict[str, Any]) -> None:
    plain = {k: v for k, v in baseline.items() if k != "perf"}
    path = write(tmp_path, "plain.json", plain)
    status, out, _ = run(capsys, path, path)
    assert status == 0
    assert "Neither report holds a perf screening: speed not compared." in out


H200 = ROOT / "fixtures" / "perf" / "h200"


def test_two_h200_runs_of_the_same_software_are_not_a_regression() -> None:
    """The A/A pair recorded on the H200 (2 block pairs, then 1): four OFF cells were
    12-35% slower and others as much faster. With one block pair on a side nothing can be
    told from noise, so the compare passes and says how many cells it could not judge."""
    out = cli(H200 / "blocks2.json", H200 / "blocks1.json", "--max-regression", "10%")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "REGRESSION" not in out.stdout
    assert "RESULT: OK: no correctness difference, no significant regression beyond 10%; " \
        "13 cell(s) changed by more than 10% without enough block pairs to tell from noise " \
        "(4 slower, 9 faster; BEFORE 2, AFTER 1 block pairs: run --sharedkv-blocks 2 or more " \
        "on both sides to judge them)\n" in out.stdout
    (row,) = [line for line in out.stdout.splitlines() if line.startswith("| 32k  | OFF | local")]
    assert "| +34.6% | slower +34.6%, not judged: BEFORE 2, AFTER 1 block pairs (the t-test " \
        "needs >= 2 on each side) |" in row
    assert out.stdout.count("slower +") == 4 and out.stdout.count("faster -") == 9


def test_the_verdict_is_a_word_the_text_is_rendered_from(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What fails a compare is the verdict (``judge``), not its text: rewording the text
    of every verdict changes no exit status and no regression count."""
    steady = Change(("8k", "ON", "cross"), _stat(1.0, 0.99, 1.01, 1.0), _stat(1.2, 1.19, 1.21))
    noisy = Change(("8k", "ON", "cross"), _stat(1.0, 0.9, 1.1, 1.0), _stat(1.2, 0.8, 1.6, 1.2))
    lone = Change(("x",), _stat(1.0, 1.0, 1.01), _stat(1.5, 1.5))
    gone = Change(("x",), _stat(1.0, 1.0, 1.01), None)
    judged = [c.judge(0.10) for c in (steady, noisy, lone, gone)]
    assert judged == [Verdict.REGRESSION, Verdict.WITHIN_NOISE, Verdict.NOT_JUDGED,
                      Verdict.MISSING]
    monkeypatch.setattr(Change, "verdict", lambda self, limit: "reworded")
    assert [c.failed(0.10) for c in (steady, noisy, lone, gone)] == [True, False, False, True]
    assert regressions([steady, noisy, lone, gone], 0.10) == [steady]


def _stat(median: float, *per_pair: float) -> Stat:
    return Stat(median, 3 * len(per_pair), len(per_pair), tuple(per_pair))


def test_a_change_inside_its_block_pairs_spread_is_within_noise() -> None:
    noisy = Change(("8k", "ON", "cross"), _stat(1.0, 0.9, 1.1, 1.0),
                           _stat(1.2, 0.8, 1.6, 1.2))
    assert noisy.verdict(0.10) == "slower +20.0%, within noise (t=0.70, df=2.3, needs t > 2.92)"
    assert not noisy.failed(0.10) and noisy.within_noise(0.10) and not noisy.not_judged(0.10)
    steady = Change(("8k", "ON", "cross"), _stat(1.0, 0.99, 1.01, 1.0),
                            _stat(1.2, 1.19, 1.21, 1.2))
    assert steady.verdict(0.10) == "REGRESSION" and steady.failed(0.10)
    assert not steady.not_judged(0.10) and not steady.within_noise(0.10)
    assert Change(("x",), _stat(1.2, 1.19, 1.21), _stat(1.0, 0.99, 1.01)
                          ).verdict(0.10) == "faster"
    flat = Change(("x",), _stat(1.0, 1.0, 1.0), _stat(1.5, 1.5, 1.5))
    assert flat.verdict(0.10) == "REGRESSION"  # no spread at all: any change is real
    assert Change(("x",), _stat(1.0, 1.0, 1.0), _stat(1.05, 0.5, 1.6)
                          ).verdict(0.10) == "ok"  # inside the threshold: not tested
    # one-sided in the change's direction: a slower median whose pairs say faster is noise
    backwards = Change(("x",), _stat(1.0, 1.2, 1.25, 1.3),
                               _stat(1.2, 0.9, 0.95, 1.0))
    test = backwards.test()
    assert test is not None and test.t < -test.critical
    assert backwards.verdict(0.10).startswith("slower +20.0%, within noise (t=-")
    lone = Change(("x",), _stat(1.0, 1.0, 1.01), _stat(1.5, 1.5))
    assert lone.verdict(0.10) == "slower +50.0%, not judged: BEFORE 2, AFTER 1 block pairs " \
        "(the t-test needs >= 2 on each side)"
    assert lone.not_judged(0.10) and not lone.failed(0.10)


def only_pairs(data: dict[str, Any], *keep: int) -> dict[str, Any]:
    """DATA screened with its first block pairs KEEP only (as if run with fewer blocks)."""
    out = copy.deepcopy(data)
    perf = out["perf"]
    perf["observations"] = [o for o in perf["observations"] if o["pair"] in keep]
    perf["sessions"] = [s for s in perf["sessions"] if s["pair"] in keep]
    perf["blocks"], perf["restarts_s"] = perf["blocks"][:2 * len(keep)], \
        perf["restarts_s"][:2 * len(keep)]
    return out


def test_a_steady_50_percent_slowdown_over_two_block_pairs_is_a_regression(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, baseline: dict[str, Any]) -> None:
    two = only_pairs(baseline, 0, 1)
    before = write(tmp_path, "before.json", two)
    status, out, _ = run(capsys, before, write(tmp_path, "after.json", slower(two, 1.5)))
    assert status == 1
    (row,) = [line for line in out.splitlines() if "REGRESSION" in line]
    assert row.startswith("| 8k   | ON  | cross") and "| +50.0% |" in row
    assert "(n=4, 2 pairs)" in row
    assert "RESULT: FAIL: 1 significant regression(s) beyond 10%\n" in out


def test_a_50_percent_slowdown_with_one_block_pair_on_a_side_is_not_judged(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, baseline: dict[str, Any]) -> None:
    after = slower(only_pairs(baseline, 0), 1.5)
    status, out, _ = run(capsys, SCREENING, write(tmp_path, "after.json", after))
    assert status == 0
    assert "REGRESSION" not in out
    (row,) = [line for line in out.splitlines() if line.startswith("| 8k   | ON  | cross")]
    assert "slower +" in row and "not judged: BEFORE 3, AFTER 1 block pairs" in row
    assert "RESULT: OK: no correctness difference, no significant regression beyond 10%; " \
        in out and "without enough block pairs to tell from noise" in out


def test_welch_on_a_hand_computed_example() -> None:
    from pytest_sharedkv.perf.significance import t_critical, welch

    result = welch([1.0, 1.1], [1.5, 1.6])
    assert result is not None
    # logs: means 0.04766 and 0.43773, variances of the mean 0.002271 and 0.001041
    assert result.t == pytest.approx(6.778, abs=0.01)
    assert result.df == pytest.approx(1.758, abs=0.01)
    assert result.critical == 6.314 and result.shows(slower=True)
    assert welch([1.0], [1.5, 1.6]) is None
    assert t_critical(1.9999999) == 2.920 and t_critical(2.7) == 2.920
    assert t_critical(31) == 1.645 and t_critical(0.4) == 6.314


def test_a_partial_pool_hit_in_after_fails_the_compare(tmp_path: Path,
                                                      baseline: dict[str, Any]) -> None:
    """An upgrade after which B finds only part of A's prompt in the pool is a difference
    even if the times look fine: the cross TTFT is no longer a transfer time."""
    after = copy.deepcopy(baseline)
    for o in after["perf"]["observations"]:
        if (o["arm"], o["step"], o["request"], o["block"]) == ("ON", "cross", "8k-0", 1):
            o["cached_tokens"] = 256
    out = cli(SCREENING, write(tmp_path, "after.json", after))
    assert out.returncode == 1, out.stdout
    (row,) = [line for line in out.stdout.splitlines() if "PARTIAL pool hit" in line]
    assert "| NEW " in row and "request 8k-0 block 1 arm ON" in row
    assert "found 256 of 8,175 prompt tokens in a cache, a full hit is 7,936" in row


def with_engine(data: dict[str, Any], **settings: Any) -> dict[str, Any]:
    """DATA as if screened with these engine settings (providers.EngineSettings.record)."""
    from pytest_sharedkv.stack.engine_settings import PERF_ENGINE

    out = copy.deepcopy(data)
    out["perf"]["engine_settings"] = {**PERF_ENGINE.record(), **settings}
    return out


def test_engine_flags_that_differ_are_named_and_speed_is_not_judged(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, baseline: dict[str, Any]) -> None:
    """Eager BEFORE, CUDA graphs and user flags AFTER: a FLAGS DIFFER line names both, and a
    steady 50% slowdown (a REGRESSION with the same flags) is shown, not judged: exit 0;
    --allow-flag-change judges it: exit 1."""
    two = only_pairs(baseline, 0, 1)
    before = write(tmp_path, "before.json", with_engine(two, enforce_eager=True))
    after = write(tmp_path, "after.json", with_engine(slower(two, 1.5), extra_args=["--x"]))
    status, out, _ = run(capsys, before, after)
    assert status == 0
    (line,) = [x for x in out.splitlines() if x.startswith("FLAGS DIFFER: ")]
    assert "enforce_eager: BEFORE True, AFTER False" in line
    assert "extra_args: BEFORE [], AFTER [\"--x\"]" in line
    assert "not judged as regressions" in line and "--allow-flag-change" in line
    assert "REGRESSION" not in out
    (row,) = [x for x in out.splitlines() if x.startswith("| 8k   | ON  | cross")]
    assert "slower +50.0%, not judged: FLAGS DIFFER" in row
    status, out, _ = run(capsys, before, after, "--allow-flag-change")
    assert status == 1 and "REGRESSION" in out and "judged anyway" in out


def test_the_same_engine_flags_say_nothing_and_judge_speed(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, baseline: dict[str, Any]) -> None:
    two = with_engine(only_pairs(baseline, 0, 1))
    status, out, _ = run(capsys, write(tmp_path, "before.json", two),
                         write(tmp_path, "after.json", slower(two, 1.5)))
    assert status == 1 and "FLAGS DIFFER" not in out and "REGRESSION" in out


def test_a_report_without_engine_settings_differs_from_one_with(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, baseline: dict[str, Any]) -> None:
    """A report from before the settings were recorded ran eager (hard-coded): its flags
    are unknown, which is a difference, not a match."""
    status, out, _ = run(capsys, SCREENING, write(tmp_path, "after.json", with_engine(baseline)))
    assert status == 0
    assert "FLAGS DIFFER: engine settings: BEFORE recorded none" in out


def test_the_other_tiers_engine_facts_that_differ_are_named(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, baseline: dict[str, Any]) -> None:
    """Reports without perf compare the engine_settings facts the replica and service
    tiers record (ReplicaPair.record_launches), where both have them."""
    from pytest_sharedkv.stack.engine_settings import EngineSettings

    plain = {k: v for k, v in baseline.items() if k != "perf"}

    def facts(**settings: Any) -> dict[str, Any]:
        value = json.dumps({**EngineSettings().record(), **settings}, sort_keys=True)
        return {**plain, "facts": [{"name": "engine_settings", "value": value,
                                    "nodeid": "suites/test_replica_pair.py::t"}]}

    before = write(tmp_path, "before.json", facts())
    status, out, _ = run(capsys, before, write(tmp_path, "after.json", facts(max_num_seqs=4)))
    assert status == 0
    assert "FLAGS DIFFER: max_num_seqs: BEFORE 16, AFTER 4: the engines ran differently" in out
    status, out, _ = run(capsys, before, before)
    assert "FLAGS DIFFER" not in out
    status, out, _ = run(capsys, write(tmp_path, "plain.json", plain), before)
    assert "FLAGS DIFFER" not in out  # an older report recorded none: nothing to compare


def test_reports_of_no_common_tier_do_not_compare_and_partial_ones_say_so(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The real H200 reports: LMCache 0.5.3's replica_pair run against 0.5.6's
    service_regression run shares no tier (every AFTER test would read as new); the 0.5.6
    pinned_pool + replica_pair run against 0.5.3's replica_pair run shares one."""
    h200 = SCREENING.parents[1] / "lmcache" / "h200"
    status, out, err = run(capsys, h200 / "replica_pair-0.5.3-compiled.json",
                           h200 / "service-0.5.6-fallback-lazy-triage2.json")
    assert (status, out) == (2, "")
    assert err == ("python -m pytest_sharedkv compare: incomparable reports: no tier in "
                   "common: BEFORE ran replica_pair, AFTER ran service_regression (run both "
                   "with the same -m)\n")
    status, out, _ = run(capsys, h200 / "pinned_pool-replica_pair-0.5.6-compiled.json",
                         h200 / "replica_pair-0.5.3-compiled.json")
    assert status == 1
    assert "TIERS DIFFER: only BEFORE ran pinned_pool: a test of a tier only BEFORE ran is " \
        "lost here, whatever the stack did (run both with the same -m)" in out
