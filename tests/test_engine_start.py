"""``stack.engine_start``: the phases of an engine's start, read from the lines vLLM 0.26
logged on the H200 (the 27b-compute screening's second session), and the report's line."""

from __future__ import annotations

from pytest_sharedkv.stack.launch.engine_start import READY, describe, starts_note, vllm_phases
from tests.h200_logs import H200, sections

LOG = H200 / "perf-27b-compiled-s2-engine-start.log"


def _sections() -> dict[str, str]:
    return sections(LOG)


def test_the_phases_of_a_real_compute_engine_start() -> None:
    phases = vllm_phases(_sections()["OFF-167683534604/vllm-A-58575.log"])
    assert phases == {"weights": 3.808362, "torch.compile": 144.59, "profiling/warmup": 124.94,
                      "graph capture": 15.0, "engine init": 298.46}


def test_the_phases_of_an_engine_with_vllms_own_offloading() -> None:
    """The NATIVE arm's engine (vLLM's OffloadingConnector, 32 GB) on the hybrid
    27b-compute model, from its H200 start: it serves the model, and its phases read alike."""
    text = (H200 / "native-probe-27b-compute.log").read_text()
    assert "Creating offloading spec with name: CPUOffloadingSpec" in text
    assert vllm_phases(text) == {"weights": 2.171313, "torch.compile": 93.74,
                                 "profiling/warmup": 90.34, "graph capture": 13.0,
                                 "engine init": 228.94}


def test_the_server_log_and_an_eager_engine_name_no_phase_they_lack() -> None:
    assert vllm_phases(_sections()["ON-758763654751/lmcache-server-54177.log"]) == {}
    eager = "\n".join(line for line in _sections()["ON-758763654751/vllm-B-45127.log"]
                      .splitlines() if "compile" not in line and "Graph captur" not in line)
    assert set(vllm_phases(eager)) == {"weights", "profiling/warmup", "engine init"}


def test_the_last_start_in_a_log_counts() -> None:
    text = ("torch.compile took 144.59 s in total\n"
            "torch.compile took 3.25 s in total\n")
    assert vllm_phases(text) == {"torch.compile": 3.25}


def test_the_report_line() -> None:
    starts = {"lmcache server (mixed)": {READY: 70.04},
              "vllm replica A": {READY: 330.0, "torch.compile": 141.07,
                                 "profiling/warmup": 121.79}}
    assert describe(starts) == ("lmcache server (mixed) ready 70.0 s; vllm replica A ready "
                                "330.0 s (torch.compile 141.1 s, profiling/warmup 121.8 s)")
    launches = [{"arm": "OFF", "processes": [], "restart_s": 387.89, "start": {}},
                {"arm": "ON", "processes": [], "restart_s": 425.28, "start": starts}]
    note = starts_note(launches)
    assert note is not None and note.startswith("engine starts: block 1 (ON) 425.3 s: ")
    assert starts_note([{"arm": "OFF", "processes": []}]) is None  # an older report
