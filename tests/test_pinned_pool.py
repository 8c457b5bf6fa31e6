"""pinned_pool plumbing without a GPU: predictions, the shared host budget, the child
process's failure messages, and the judge that turns a child's report into problems."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_sharedkv.pinned_pool.budget import HostBudget, Reservation
from pytest_sharedkv.pinned_pool.child import ChildResult, child_env, run_child
from pytest_sharedkv.pinned_pool.fixtures import RouteReport, _judge
from pytest_sharedkv.pinned_pool.predict import next_power_of_two, predicted_reservation

GIB = 1 << 30


def test_predictions() -> None:
    assert next_power_of_two(17 * GIB + (1 << 20)) == 32 * GIB
    assert predicted_reservation("torch-pin-memory", 64 * GIB) == 64 * GIB
    # LMCache's torch-fallback Mixed pool asks for size + 4096: a 2^k pool pins 2^(k+1)
    assert predicted_reservation("lmcache-mixed", 64 * GIB) == 128 * GIB
    assert predicted_reservation("torch-pin-memory", GIB + 1, round_threshold_bytes=GIB) == GIB + 1
    assert predicted_reservation("lmcache-lazy", GIB + 1) == GIB + (64 << 20)
    assert predicted_reservation("sharedkv-register", GIB + 1) == GIB + 4096


def test_worker_samples_every_64_mib(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    from pytest_sharedkv.pinned_pool.worker import SAMPLE_STRIDE, sample_offsets

    n = 5 * SAMPLE_STRIDE + 123
    offsets = sample_offsets(n)
    assert offsets[0] == 0
    assert offsets[-1] == n - 1
    assert {o // SAMPLE_STRIDE for o in offsets} == set(range(6))


def test_budget_is_shared_and_says_why(tmp_path: Path) -> None:
    first = HostBudget(tmp_path, 10 * GIB)
    second = HostBudget(tmp_path, 10 * GIB)  # another worker, same ledger
    held = first.reserve(6 * GIB, "gw0 pool")
    assert isinstance(held, Reservation)
    refused = second.reserve(6 * GIB, "gw1 pool")
    assert refused == "gw1 pool needs 6.00 GiB; other workers hold 6.00 GiB of a 10.00 GiB " \
                      "host budget"
    assert second.reserve(11 * GIB, "huge") == ("huge needs 11.00 GiB of pinned host memory; "
                                                "the host budget is 10.00 GiB")
    held.release()
    again = second.reserve(6 * GIB, "gw1 pool")
    assert isinstance(again, Reservation)
    again.release()
    assert first.held() == 0


def test_budget_ignores_entries_of_dead_processes(tmp_path: Path) -> None:
    budget = HostBudget(tmp_path, 10 * GIB)
    (tmp_path / "sharedkv-host-budget.json").write_text(json.dumps({"999999999:ghost": 9 * GIB}))
    assert isinstance(budget.reserve(8 * GIB, "pool"), Reservation)


def test_budget_ignores_a_crashed_holder_whose_pid_was_reused(tmp_path: Path) -> None:
    """A crashed worker's reservation, left in the ledger under a PID that another process
    now has (here: our parent), holds nothing: a reservation lives exactly while its holder
    holds its lock."""
    budget = HostBudget(tmp_path, 10 * GIB)
    leftover = {f"{os.getppid()}:crashed worker's pool": 9 * GIB}
    (tmp_path / "sharedkv-host-budget.json").write_text(json.dumps(leftover))
    held = budget.reserve(8 * GIB, "pool")
    assert isinstance(held, Reservation)
    held.release()
    # the same leftover in today's ledger: a reservation file whose lock nobody holds
    (tmp_path / f"{os.getppid()}-crashed.reservation").write_text(
        json.dumps({"pid": os.getppid(), "nbytes": 9 * GIB, "what": "crashed worker's pool"}))
    assert budget.held() == 0
    held = budget.reserve(8 * GIB, "pool")
    assert isinstance(held, Reservation)
    held.release()


HOLDER = """
import sys, time
from pathlib import Path
from pytest_sharedkv.pinned_pool.budget import HostBudget
held = HostBudget(Path(sys.argv[1]), 10 << 30).reserve(6 << 30, "child pool")
print("held" if not isinstance(held, str) else held, flush=True)
time.sleep(60)
"""


def test_budget_counts_a_live_holder_until_it_is_killed(tmp_path: Path) -> None:
    import signal
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        budget = HostBudget(tmp_path, 10 * GIB)
        assert budget.held() == 6 * GIB
        assert budget.reserve(6 * GIB, "pool") == ("pool needs 6.00 GiB; other workers hold "
                                                   "6.00 GiB of a 10.00 GiB host budget")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert budget.held() == 0
        again = budget.reserve(6 * GIB, "pool")
        assert isinstance(again, Reservation)
        again.release()
    finally:
        proc.kill()
        proc.wait()


def _child(code: str, timeout: float = 30) -> ChildResult:
    return run_child([sys.executable, "-c", code], child_env(None), timeout, "test pool")


def test_child_killed_by_the_oom_killer_is_named() -> None:
    result = _child("import os, signal, sys\nprint('pinning...', file=sys.stderr, flush=True)\n"
                    "os.kill(os.getpid(), signal.SIGKILL)")
    assert result.data is None
    assert result.error == ("test pool: the allocator process died with SIGKILL (the OOM "
                            "killer, most likely: the pool did not fit in host memory)")
    assert result.stderr_tail == ["pinning..."]


def test_child_timeout_is_killed_with_its_group() -> None:
    result = _child("import time, subprocess, sys\n"
                    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                    "time.sleep(60)", timeout=1.0)
    assert result.error == ("test pool: the allocator process did not finish within 1s and "
                            "was killed")


def test_pageable_fallback_warning_is_caught() -> None:
    result = _child(
        "import sys\n"
        "print(\"LMCache WARNING: Pinned host allocation failed on device 'cuda'; falling back"
        " to unpinned allocation from now on.\", file=sys.stderr)\n"
        "print('SHAREDKV-POOL {\"checked\": 1, \"pinned\": 0}')")
    assert result.data == {"checked": 1, "pinned": 0}
    assert len(result.fallback_warnings) == 1


@pytest.mark.parametrize(("data", "warnings", "problems"), [
    ({"checked": 10, "pinned": 10, "first_pageable": None, "reserved": GIB}, [], []),
    ({"checked": 10, "pinned": 7, "first_pageable": 3 << 26, "reserved": GIB}, [],
     ["3 of 10 sampled addresses are pageable (first at byte offset 201326592): the pool "
      "is not fully pinned"]),
    ({"checked": 4, "pinned": 4, "first_pageable": None, "reserved": 2 * GIB}, [],
     ["reserved 2.00 GiB for 1.00 GiB asked (2.00x; the limit is 1.01x): the host allocator "
      "rounded the request up"]),
    ({"checked": 4, "pinned": 4, "first_pageable": None, "reserved": None},
     ["LMCache WARNING: pin_memory failed for chunk"],
     ["pageable fallback reported: LMCache WARNING: pin_memory failed for chunk"]),
])
def test_judge(data: dict[str, object], warnings: list[str], problems: list[str]) -> None:
    report = RouteReport("r", GIB)
    _judge(report, ChildResult(dict(data), None, [], warnings))
    assert report.problems == problems


NO_DEVICE = "needs 1 CUDA device, 0 visible"


def test_suite_skips_without_cuda_and_fails_under_require_gpu(
    pytester: pytest.Pytester, fake_gpus: Callable[[str], None]
) -> None:
    base = ["--pyargs", "pytest_sharedkv.suites", "-m", "pinned_pool", "-p", "no:cacheprovider"]
    result = pytester.runpytest_subprocess(*base, "-rs")
    assert result.parseoutcomes()["skipped"] == 7
    assert NO_DEVICE in result.stdout.str()
    fake_gpus("0")
    result = pytester.runpytest_subprocess(*base, "-rs")
    assert result.parseoutcomes()["skipped"] == 7
    reasons = result.stdout.str()
    assert "sees no CUDA device" in reasons or "lmcache not importable" in reasons
    assert NO_DEVICE not in reasons  # the inner run leased the fake device it was given
    strict = pytester.runpytest_subprocess(*base, "--sharedkv-require-gpu")
    assert strict.ret == 1
