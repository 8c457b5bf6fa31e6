"""The perf record round-trips through JSON, and a foreign or broken one is refused with
the path of what is wrong; the committed fixture is what its seeded script makes."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.perf.observations import (
    Floor,
    PerfReportError,
    from_json,
    size_order,
    size_tokens,
    to_json,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "perf"


@pytest.fixture(scope="module")
def perf_data() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / "screening.json").read_text())["perf"]
    return data


def test_the_committed_screening_is_what_its_script_makes() -> None:
    spec = importlib.util.spec_from_file_location("make_reports", FIXTURES / "make_reports.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.text() == (FIXTURES / "screening.json").read_text()


def test_round_trip(perf_data: dict[str, Any]) -> None:
    run = from_json(perf_data)
    # the committed screening predates the model, engine settings and launch records:
    # they read back empty
    assert to_json(run) == {**perf_data, "model": {}, "engine_settings": {}, "launches": []}
    assert from_json(to_json(run)) == run
    assert run.blocks == ["OFF", "ON", "ON", "OFF", "OFF", "ON"]
    assert sum(o.warmup for o in run.observations) == 6


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.update(schema="pytest-sharedkv-perf/2"),
     "perf.schema: 'pytest-sharedkv-perf/2' is not 'pytest-sharedkv-perf/1'"),
    (lambda d: d.pop("model_digest"), "perf.model_digest: expected a string"),
    (lambda d: d["observations"][3].pop("ttft_s"),
     "perf.observations[3]: missing field 'ttft_s'"),
    (lambda d: d["observations"][2].update(arm="MAYBE"),
     "perf.observations[2].arm: 'MAYBE' is not one of OFF, ON, HOSTS, NATIVE"),
    (lambda d: d["observations"][2].update(prompt_tokens=True),
     "perf.observations[2].prompt_tokens: expected an integer"),
    (lambda d: d["sessions"][0].update(placement="random"),
     "perf.sessions[0].placement: 'random' is not one of fixed, alternating"),
    (lambda d: d["floor"].update(h2d_gb_s=0), "perf.floor.h2d_gb_s: must be positive"),
    (lambda d: d.update(blocks="OFF,ON"), "perf.blocks: expected a list"),
    (lambda d: d.update(block_pairs=[0, 0, 1, 1]),
     "perf.block_pairs: 4 entries for 6 blocks (one pair number a block)"),
    (lambda d: d.update(block_pairs=[1, 1, 2, 2, 3, 3]),
     "perf.block_pairs[0]: expected 0, found 1"),
    (lambda d: d.update(block_pairs=[0, 0, 2, 2, 3, 3]),
     "perf.block_pairs[2]: expected 0 or 1, found 2"),
    (lambda d: d.update(block_pairs=[0, 0, 1, 1, 1, 1]),  # the records say blocks 4, 5: pair 2
     "perf.observations[100].pair: 2, but perf.block_pairs puts block 4 in block pair 1"),
])
def test_a_broken_record_is_refused_by_path(perf_data: dict[str, Any], change: Any,
                                            message: str) -> None:
    data = copy.deepcopy(perf_data)
    change(data)
    with pytest.raises(PerfReportError) as caught:
        from_json(data)
    assert str(caught.value).startswith(message)


def test_block_pairs_round_trip_and_stay_out_where_not_recorded(
        perf_data: dict[str, Any]) -> None:
    """A report that records its pairs reads them back; one written before the field (the
    committed screening) reads none and writes none, as before."""
    run = from_json(perf_data)
    assert run.block_pairs == [] and "block_pairs" not in to_json(run)
    recorded = {**perf_data, "block_pairs": [0, 0, 1, 1, 2, 2]}
    assert from_json(recorded).block_pairs == [0, 0, 1, 1, 2, 2]
    assert to_json(from_json(recorded))["block_pairs"] == [0, 0, 1, 1, 2, 2]


def test_not_an_object_is_refused() -> None:
    with pytest.raises(PerfReportError, match="perf: expected an object, found list"):
        from_json([])


def test_sizes_and_the_floor() -> None:
    assert size_tokens("8k") == 8192 and size_tokens("128k") == 131072
    assert size_tokens("3000") == 3000 and size_tokens("huge") is None
    assert sorted(["128k", "huge", "8k", "32k"], key=size_order) == ["8k", "32k", "128k",
                                                                     "huge"]
    floor = Floor(h2d_gb_s=50.0, kv_bytes_per_token=1000, recurrent_bytes_per_sequence=500,
                  source="test")
    assert floor.seconds(1000) == pytest.approx(1_000_500 / 50e9)
    assert floor.layout_seconds(1000) is None  # the stored layout not recorded
    laid_out = Floor(50.0, 1000, 500, "test", stored_bytes_per_token=4000)
    assert laid_out.layout_seconds(1000) == pytest.approx(4_000_000 / 50e9)


def test_the_stored_bytes_round_trip_and_stay_out_where_unknown(
        perf_data: dict[str, Any]) -> None:
    data = {**perf_data, "floor": {**perf_data["floor"], "stored_bytes_per_token": 262_144}}
    run = from_json(data)
    assert run.floor is not None and run.floor.stored_bytes_per_token == 262_144
    assert to_json(run)["floor"] == data["floor"]
    assert "stored_bytes_per_token" not in to_json(from_json(perf_data))["floor"]


def test_the_model_engine_settings_and_launches_round_trip(perf_data: dict[str, Any]) -> None:
    from pytest_sharedkv.perf.observations import PerfReportError

    data = {**perf_data, "model": {"kind": "27b-compute", "weights": "random"},
            "engine_settings": {"enforce_eager": False, "extra_args": ["--x"]},
            "launches": [{"arm": "ON", "processes": [{"name": "vllm replica A",
                                                       "argv": ["vllm"], "env": {}}]}]}
    run = from_json(data)
    assert to_json(run) == data
    assert run.model["kind"] == "27b-compute" and run.engine_settings["enforce_eager"] is False
    with pytest.raises(PerfReportError, match=r"perf\.model: expected an object of strings"):
        from_json({**perf_data, "model": {"kind": 3}})
    with pytest.raises(PerfReportError, match=r"perf\.engine_settings: expected an object"):
        from_json({**perf_data, "engine_settings": []})
