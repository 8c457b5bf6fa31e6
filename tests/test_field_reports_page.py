"""docs/field-reports.md by its rule: every row's verdict is one of the four words, and
every figure the row states about a run (the condition as run, the verdict) is one its
committed reports give: each row's figures are computed here from those reports, and a
figure on the page that is not among them fails, naming the row."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from tests.recorded import LMCACHE_H200, ROOT, checks, read

PAGE = ROOT / "docs" / "field-reports.md"
CPU = ROOT / "fixtures" / "lmcache" / "cpu"
VERDICTS = ("**reproduced**", "**not reproduced (condition occurred)**",
            "**not reachable here**", "**inconclusive**")
HEADER = ["report", "stack and build", "condition as reported",
          "condition as run, and the evidence it occurred", "verdict", "command"]
# a number outside backticks: not part of a word, an issue number, a version or a path
NUMBER = re.compile(r"(?<![\w#.\-/])\d[\d,]*(?:/\d[\d,]*)?(?![\w\-/]|[.,]\d)")


def rows() -> dict[str, list[str]]:
    lines = PAGE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines)
                 if [c.strip() for c in line.strip("|").split("|")] == HEADER)
    found: dict[str, list[str]] = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == len(HEADER), line[:80]
        found[cells[0]] = cells
    return found


def figures(text: str) -> set[str]:
    """The numbers TEXT states, outside its code spans."""
    plain = re.sub(r"`[^`]*`", "", text)
    return {m.group(0).rstrip(",") for m in NUMBER.finditer(plain)}


def _n(value: int) -> str:
    return f"{value:,}"


def _steps(name: str) -> dict[str, Any]:
    report = read(LMCACHE_H200 / f"{name}.json")
    return {str(c.key["step"]): c for c in checks(report, "service_regression")
            if c.key.get("size") == "3k" and c.key.get("step") != "chain"}


def _fraction(check: Any) -> str:
    return f"{check.passed}/{check.trials}"


def fused() -> set[str]:
    steps, control = _steps("inprocess-0.5.6-redis-ca"), _steps("service-0.5.6-compiled-mixed-ca")
    return {_fraction(steps["cold"]), _fraction(steps["cross"]),
            _n(steps["cross"].detail["cached"]), _fraction(steps["identical requests x4"]),
            _fraction(control["cross"])}


def later() -> set[str]:
    steps = _steps("inprocess-0.5.6-4463-local-cpu")
    twins = steps["identical requests x4"]
    distinct = set(twins.detail["distinct"].values())
    assert len(distinct) == 1
    return {str(twins.detail["k"]), str(len(twins.detail["prompts"])), str(twins.trials),
            str(distinct.pop()), _fraction(steps["local"]), _fraction(steps["receiver-local"])}


def disk() -> set[str]:
    report = json.loads((CPU / "lmcache-4385-disk-paging.json").read_text())
    totals, returns = report["totals"], report["returns"]
    sessions = {s["session"] for s in report["sessions"]}
    turns = {s["visit"] for s in report["sessions"] if s["visit"] != "return"}
    return {str(len(sessions)), str(len(turns) + 1), str(report["cpu_capacity_chunks"]),
            str(totals["chunks"]), str(totals["from_disk"]), str(returns["from_disk"]),
            str(returns["chunks"]), str(totals["wrong"])}


def write_race() -> set[str]:
    plain = json.loads((CPU / "lmcache-4991-write-race.json").read_text())
    held = json.loads((CPU / "lmcache-4991-write-race-hold.json").read_text())
    truncated = json.loads((CPU / "lmcache-4991-write-race-truncate.json").read_text())
    short = plain["condition"]["short"]
    found = {_n(short["offset"]), _n(short["size"]), str(truncated["raced_entry"]["bytes"]),
             str(truncated["condition"]["raise"]["offset"])}
    for report in (plain, held, truncated):
        counts = report["counts"]
        found |= {str(counts["keys_served"]), *map(str, counts["stores_failed"].values())}
    found |= {str(plain["counts"]["pages_compared"]),
              *map(str, plain["counts"]["pages"].values())}
    return found


SIMPLE = ("native-simple-vllm-0.26.0", "native-simple-vllm-0.26.0-2-cut",
          "native-simple-vllm-0.26.0-3", "native-simple-vllm-0.26.0-no-gate")
OFFLOADING = ("native-offloading-vllm-0.26.0", "native-offloading-vllm-0.26.0-2-cut",
              "native-offloading-ca-vllm-0.26.0")


def _wrong_turns(name: str) -> list[tuple[str, int]]:
    sessions = [c for c in checks(read(LMCACHE_H200 / f"{name}.json"), "service_regression")
                if c.key.get("size") == "session"]
    return [(str(c.detail["session"]), c.trials) for c in sessions if c.passed < c.trials]


def simple() -> set[str]:
    wrong = {name: _wrong_turns(name) for name in SIMPLE}
    assert all(len(w) == 1 for w in wrong.values()), wrong
    turns = {8 * trials for w in wrong.values() for _, trials in w}  # 8 sessions a run
    times = sum(1 for w in wrong.values() if w[0][0] == "session-00")
    assert all(_wrong_turns(name) == [] for name in OFFLOADING)
    return {*map(str, turns), str(len(SIMPLE)), str(times), str(len(OFFLOADING))}


def boundary() -> set[str]:
    found: set[str] = set()
    for name in ("native-offloading-vllm-0.26.0", "native-simple-vllm-0.26.0"):
        [cell] = [c for c in checks(read(LMCACHE_H200 / f"{name}.json"), "service_regression")
                  if c.key.get("size") == "boundary"]
        lengths, cached = cell.detail["lengths"], cell.detail["cached_each"]
        found |= {_n(min(lengths.values())), _n(max(lengths.values()))}
        found |= {_n(n) for k, n in lengths.items() if cached[k] == 0}
        found |= {_n(c) for c in cached.values()}
        found.add(str(cell.detail.get("block", 16)))
    return found


FIGURES: dict[str, Callable[[], set[str]]] = {
    "LMCache #4463 (open)": fused,
    "LMCache #4463, its later report": later,
    "LMCache #4385 (open)": disk,
    "LMCache #4991 (open)": write_race,
    "LMCache #4762": set,
    "LMCache #5230": set,
    "vLLM #45704 (closed)": simple,
    "vLLM #47282 (open)": set,
    "vLLM #51094 (closed)": boundary,
    "vLLM #52360": set,
    # issue 50 (cache identity) and issue 53 (SGLang): their CPU runs are self-tests that
    # assert their counts and commit no report of them, so these rows state no figure
    "vLLM #44250 (open)": set,
    "vLLM #44701 (open)": set,
    "vLLM #56311 / PR #56331 (open)": set,
    "LMCache #4825 (open)": set,
    "SGLang #37160 (open)": set,
    "vLLM #53495 (open)": set,
    "vLLM PR #51748 (open)": set,
    "SGLang #39830 (open)": set,
}
# the GPU rows not yet run: inconclusive, naming the plan that makes their condition
GPU_PLANS = {
    "vLLM #44250 (open)": "identity-table.sh",
    "vLLM #44701 (open)": "identity-table.sh",
    "vLLM #56311 / PR #56331 (open)": "identity-restart.sh",
    "SGLang #37160 (open)": "sglang-service.sh",
}
PLANS = ROOT / "contrib" / "gpu-host" / "plans"
CITED_TEST = re.compile(r"(tests/test_\w+\.py)(?:::(\w+))?")
CITED_PLAN = re.compile(r"contrib/gpu-host/plans/([\w.-]+\.sh)")


def test_the_page_has_a_row_for_every_report_the_issue_names() -> None:
    assert list(rows()) == list(FIGURES)


@pytest.mark.parametrize("row", list(FIGURES))
def test_a_rows_verdict_is_one_of_the_four_words(row: str) -> None:
    verdict = rows()[row][4]
    assert verdict.startswith(VERDICTS), verdict[:60]


@pytest.mark.parametrize("row", list(FIGURES))
def test_every_figure_a_row_states_about_its_run_is_its_reports(row: str) -> None:
    cells = rows()[row]
    stated = figures(cells[3]) | figures(cells[4])
    allowed = FIGURES[row]()
    assert stated <= allowed, (f"{row}: {sorted(stated - allowed)} not in its reports "
                               f"({sorted(allowed)})")


def test_a_row_that_ran_nothing_states_no_figure_and_says_what_is_missing() -> None:
    for row, cells in rows().items():
        if cells[3] == "nothing run" or cells[3].startswith("nothing run "):
            assert FIGURES[row] is set and cells[4].startswith(
                ("**inconclusive**: not run", "**inconclusive**: the likelier",
                 "**not reachable here**")), row


def test_the_write_race_row_never_claims_a_verdict_its_reports_do_not_give() -> None:
    """The #4991 row's verdict is both committed reports' verdict, and its condition
    occurred in each (an edited report fails tests/test_write_race_4991.py)."""
    verdicts = {json.loads((CPU / f).read_text())["verdict"]
                for f in ("lmcache-4991-write-race.json", "lmcache-4991-write-race-hold.json",
                          "lmcache-4991-write-race-truncate.json")}
    assert verdicts == {"not reproduced"}
    assert rows()["LMCache #4991 (open)"][4].startswith("**not reproduced (condition occurred)**")


def test_the_boundary_row_is_not_called_not_reproduced() -> None:
    """vLLM #51094: the exact-boundary load never happened (0 tokens reloaded for a
    prompt of whole blocks), so the row cannot say "not reproduced"."""
    verdict = rows()["vLLM #51094 (closed)"][4]
    assert not verdict.startswith("**not reproduced") and "`align` only" in verdict


@pytest.mark.parametrize("row", list(GPU_PLANS))
def test_a_gpu_row_not_yet_run_is_inconclusive_naming_its_plan(row: str) -> None:
    verdict = rows()[row][4]
    assert verdict.startswith("**inconclusive**"), verdict[:60]
    assert f"contrib/gpu-host/plans/{GPU_PLANS[row]}" in verdict, verdict
    assert (PLANS / GPU_PLANS[row]).is_file()


def test_every_self_test_and_plan_a_row_cites_exists() -> None:
    """A row whose evidence is a self-test or a plan names one that is there: the module,
    the test function where one is named, the plan file."""
    for row, cells in rows().items():
        text = " ".join(cells)
        for module, name in CITED_TEST.findall(text):
            path = ROOT / module
            assert path.is_file(), f"{row}: {module} is not there"
            if name:
                assert f"def {name}(" in path.read_text(), f"{row}: {module}::{name} is not there"
        for plan in CITED_PLAN.findall(text):
            assert (PLANS / plan).is_file(), f"{row}: plans/{plan} is not there"


def test_the_salt_key_row_is_reproduced_only_at_the_key_and_only_on_cpu() -> None:
    """LMCache #4825: the CPU self-tests ran the adapter's key and the server's unsalted
    lookup; SGLang itself has not run, so the row says where it stops, and the SGLang row
    (the same leak through SGLang) stays inconclusive until its plan runs."""
    key, through = rows()["LMCache #4825 (open)"], rows()["SGLang #37160 (open)"]
    assert key[4].startswith("**reproduced** on CPU, at LMCache 0.5.6's key")
    assert "Not through SGLang" in key[4]
    assert through[4].startswith("**inconclusive**: SGLang has not run")
