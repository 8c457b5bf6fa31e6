"""The topology in what outlives the run: the stored references' key names the hosts
topology and its L2 (and a baseline of another topology is no engine drift), and
``compare`` says TOPOLOGY DIFFERS where two reports ran different topologies or L2s:
speed shown, not judged, unless --allow-topology-change; correctness compared as always.
BEFORE is the real one-GPU 27b-compute screening of two H200 sessions (merged: two block
pairs, enough to judge); AFTER is its copy run in the hosts topology, every cold TTFT 30%
slower."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_sharedkv.cli.compare.main import main
from pytest_sharedkv.cli.merge import main as merge_main
from pytest_sharedkv.service import references
from pytest_sharedkv.stack.topology import HOSTS, SHARED, HostsSpec, Topology

H200 = Path(__file__).resolve().parents[1] / "fixtures" / "perf" / "h200"
S1, S2 = H200 / "perf-27b-compiled-s1.json", H200 / "perf-27b-compiled-s2.json"


def _pair(provider: str, l2: str | None) -> Any:
    spec = None if l2 is None else HostsSpec(json.dumps({"type": l2, "path": "/x"}), l2)
    topology = Topology(HOSTS if l2 else SHARED, (), spec=spec)
    return SimpleNamespace(labels={"provider": provider}, topology=topology)


def test_the_reference_key_names_the_hosts_topology_and_its_l2() -> None:
    assert references.engine_key(_pair("stub", None), "absent") == "stub"
    assert references.engine_key(_pair("stub", "fs"), "absent") == "stub+hosts-fs"
    launched = references.engine_key(_pair("vllm", "resp"), "absent")
    assert launched.startswith("vllm-") and launched.endswith("+hosts-resp")
    assert references.engine_order(launched)[0] is True  # still sorts as a vLLM key


def test_a_baseline_is_only_of_the_same_topology(tmp_path: Path) -> None:
    for key in ("vllm-0.26.0+lmcache-0.5.6-cuda_ops", "vllm-0.25.0+lmcache-0.5.5+hosts-fs"):
        (tmp_path / "m" / key).mkdir(parents=True)
    hosts = references.baseline(tmp_path, "m", "vllm-0.26.0+lmcache-0.5.6-cuda_ops+hosts-fs")
    assert hosts is not None and hosts.name == "vllm-0.25.0+lmcache-0.5.5+hosts-fs"
    shared = references.baseline(tmp_path, "m", "vllm-0.27.0+lmcache-0.5.6-cuda_ops")
    assert shared is not None and shared.name == "vllm-0.26.0+lmcache-0.5.6-cuda_ops"
    assert references.baseline(tmp_path, "m", "stub+hosts-resp") is None


@pytest.fixture(scope="module")
def screening(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("topology") / "one-gpu.json"
    assert merge_main([str(out), str(S1), str(S2)]) == 0
    data: dict[str, Any] = json.loads(out.read_text())
    assert "topology" not in data["environment"]["settings"]  # recorded before the option
    return data


def _as(data: dict[str, Any], topology: str | None, l2: str | None = None,
        factor: float = 1.0, perf: bool = True) -> dict[str, Any]:
    out = copy.deepcopy(data)
    settings = out["environment"]["settings"]
    if topology is not None:
        settings.update(topology=topology, l2=l2)
    for o in out["perf"]["observations"]:
        if o["step"] == "cold":
            o["ttft_s"] *= factor
    if not perf:
        del out["perf"]
    return out


def _run(capsys: pytest.CaptureFixture[str], tmp_path: Path, before: dict[str, Any],
         after: dict[str, Any], *args: str) -> tuple[int, str]:
    b, a = tmp_path / "before.json", tmp_path / "after.json"
    b.write_text(json.dumps(before))
    a.write_text(json.dumps(after))
    status = main([str(b), str(a), *args])
    return status, capsys.readouterr().out


@pytest.mark.parametrize("before", [None, "shared"], ids=["before-the-option", "shared"])
def test_shared_against_hosts_is_shown_not_judged(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, screening: dict[str, Any],
        before: str | None) -> None:
    """A report written before the option ran the shared topology; against the hosts
    topology its 30% slower cells are shown, not judged (exit 0), until
    --allow-topology-change judges them (exit 1)."""
    b, a = _as(screening, before), _as(screening, "hosts", "fs", factor=1.3)
    status, out = _run(capsys, tmp_path, b, a)
    assert status == 0 and "REGRESSION" not in out, out
    (line,) = [x for x in out.splitlines() if x.startswith("TOPOLOGY DIFFERS: ")]
    assert line.startswith("TOPOLOGY DIFFERS: BEFORE shared, AFTER hosts over L2 fs: speed "
                           "cells are shown but not judged")
    assert "--allow-topology-change judges them" in line
    assert out.index(line) < out.index("## Correctness")
    status, out = _run(capsys, tmp_path, b, a, "--allow-topology-change")
    assert status == 1 and "6 significant regression(s)" in out
    assert "speed cells judged anyway (--allow-topology-change)" in out


def test_another_l2_differs_and_one_l2_does_not(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, screening: dict[str, Any]) -> None:
    status, out = _run(capsys, tmp_path, _as(screening, "hosts", "resp"),
                       _as(screening, "hosts", "fs", factor=1.3))
    assert status == 0 and "TOPOLOGY DIFFERS: BEFORE hosts over L2 resp, AFTER hosts over " \
        "L2 fs" in out
    status, out = _run(capsys, tmp_path, _as(screening, "hosts", "fs"),
                       _as(screening, "hosts", "fs", factor=1.3))
    assert "TOPOLOGY DIFFERS" not in out and status == 1


def test_unknown_is_no_difference_and_correctness_is_still_compared(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, screening: dict[str, Any]) -> None:
    """A report without settings has no known topology: no difference. Without a perf
    screening the line says correctness is compared, and a failure still fails."""
    unknown = _as(screening, None, factor=1.0)
    del unknown["environment"]["settings"]
    status, out = _run(capsys, tmp_path, unknown, _as(screening, "hosts", "fs", factor=1.3))
    assert "TOPOLOGY DIFFERS" not in out and status == 1
    after = _as(screening, "hosts", "fs", perf=False)
    after["tests"] = [{**t, "outcome": "failed", "message": "B is not A"}
                      for t in after["tests"]]
    status, out = _run(capsys, tmp_path, _as(screening, "shared", perf=False), after)
    assert "TOPOLOGY DIFFERS: BEFORE shared, AFTER hosts over L2 fs: correctness compared " \
        "as always" in out
    assert status == 1 and "1 new correctness difference(s)" in out
