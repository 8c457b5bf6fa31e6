"""Pairing ON with OFF inside a block pair: partners share (payload, replica, step, size,
request); an observation without one, or with other token counts, is refused by name;
warm-ups take no part but stay in the data."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from pytest_sharedkv.perf.observations import Observation
from pytest_sharedkv.perf.pairing import PairingError, pair_observations
from pytest_sharedkv.perf.statistics import cells


def obs(arm: str, block: int, request: str = "8k-0", ttft_s: float = 1.0,
        **changes: object) -> Observation:
    base = Observation(arm=arm, block=block, pair=block // 2, size="8k", step="cross",
                       request=request, payload_sha256=f"sha-{request}", replica="B",
                       prompt_tokens=8175, output_tokens=16, ttft_s=ttft_s,
                       decode_tok_s=50.0, e2e_s=ttft_s + 0.3)
    return replace(base, **changes)  # type: ignore[arg-type]


def test_partners_are_matched_within_each_block_pair() -> None:
    data = [obs("OFF", 0, ttft_s=2.0), obs("ON", 1, ttft_s=0.5),
            obs("ON", 2, ttft_s=0.6), obs("OFF", 3, ttft_s=2.4),
            obs("OFF", 0, "8k-1", 1.0), obs("ON", 1, "8k-1", 0.25),
            obs("ON", 2, "8k-1", 0.3), obs("OFF", 3, "8k-1", 1.2)]
    pairing = pair_observations(data, ["OFF", "ON", "ON", "OFF"])
    assert pairing.ok
    pairs = pairing.check()
    assert [(p.pair, p.request, p.arms, p.ratio) for p in pairs] == [
        (0, "8k-0", "ON/OFF", 0.25), (0, "8k-1", "ON/OFF", 0.25),
        (1, "8k-0", "ON/OFF", 0.25), (1, "8k-1", "ON/OFF", 0.25)]


def test_an_observation_without_a_partner_is_refused_by_name() -> None:
    data = [obs("OFF", 0), obs("ON", 1), obs("OFF", 0, "8k-1")]
    pairing = pair_observations(data)
    assert len(pairing.pairs) == 1
    (refusal,) = pairing.refusals
    assert (refusal.request, refusal.block, refusal.arm) == ("8k-1", 0, "OFF")
    assert "no partner in arm ON of block pair 0" in refusal.reason
    with pytest.raises(PairingError, match=r"request 8k-1 \(block 0, arm OFF, pair 0\)"):
        pairing.check()


def test_a_partner_in_another_block_pair_or_on_another_replica_is_no_partner() -> None:
    data = [obs("OFF", 0), obs("ON", 1, replica="A"), obs("ON", 2), obs("OFF", 3)]
    refused = {(r.block, r.arm) for r in pair_observations(data).refusals}
    assert refused == {(0, "OFF"), (1, "ON")}
    other_payload = [obs("OFF", 0), obs("ON", 1, payload_sha256="something else")]
    assert len(pair_observations(other_payload).refusals) == 2


def test_a_block_that_recorded_nothing_refuses_its_partner_block() -> None:
    pairing = pair_observations([obs("OFF", 0), obs("OFF", 0, "8k-1")], ["OFF", "ON"])
    assert [(r.request, r.arm) for r in pairing.refusals] == [("8k-0", "OFF"), ("8k-1", "OFF")]
    assert all("no partner in arm ON" in r.reason for r in pairing.refusals)
    alone = pair_observations([obs("OFF", 0)])
    assert "ran only arm OFF" in alone.refusals[0].reason


@pytest.mark.parametrize("field", ["prompt_tokens", "output_tokens"])
def test_token_counts_must_match_exactly(field: str) -> None:
    changed: dict[str, Any] = {field: 8176 if field == "prompt_tokens" else 15}
    pairing = pair_observations([obs("OFF", 0), obs("ON", 1, **changed)])
    assert not pairing.pairs
    assert {(r.block, r.arm) for r in pairing.refusals} == {(0, "OFF"), (1, "ON")}
    reason = pairing.refusals[0].reason
    assert field in reason and "token counts differ" in reason
    with pytest.raises(PairingError, match=field):
        pairing.check()


def test_a_request_measured_twice_in_one_arm_is_refused() -> None:
    pairing = pair_observations([obs("OFF", 0), obs("OFF", 0), obs("ON", 1)])
    assert [r.arm for r in pairing.refusals] == ["OFF", "OFF"]
    assert "measured 2 times" in pairing.refusals[0].reason


def test_warmups_take_no_part_but_stay_in_the_data() -> None:
    warm = obs("OFF", 0, "warmup-0", ttft_s=9.0, warmup=True)
    data = [warm, obs("OFF", 0), obs("ON", 1)]
    pairing = pair_observations(data)
    assert pairing.ok and len(pairing.pairs) == 1
    assert [c.n for c in cells(data)] == [1, 1]
    assert warm in data


def test_three_arms_in_one_pair_are_refused() -> None:
    pairing = pair_observations([obs("OFF", 0), obs("ON", 1), obs("NATIVE", 1, pair=0)])
    assert len(pairing.refusals) == 3
    assert "holds the arms OFF, ON, NATIVE" in pairing.refusals[0].reason


def test_with_the_native_arm_a_pair_is_three_blocks_and_each_treatment_pairs_with_off(
        ) -> None:
    blocks = ["OFF", "ON", "NATIVE", "NATIVE", "ON", "OFF"]
    data = [obs("OFF", 0, pair=0, ttft_s=2.0), obs("ON", 1, pair=0, ttft_s=0.5),
            obs("NATIVE", 2, pair=0, ttft_s=1.5), obs("NATIVE", 3, pair=1, ttft_s=1.6),
            obs("ON", 4, pair=1, ttft_s=0.6), obs("OFF", 5, pair=1, ttft_s=2.4)]
    pairing = pair_observations(data, blocks)
    assert pairing.ok
    assert sorted((p.pair, p.arms, p.ratio) for p in pairing.pairs) == [
        (0, "NATIVE/OFF", 0.75), (0, "ON/OFF", 0.25), (1, "NATIVE/OFF", 1.6 / 2.4),
        (1, "ON/OFF", 0.25)]
    missing = pair_observations(data[:2] + data[3:], blocks)
    assert [(r.arm, r.pair) for r in missing.refusals] == [("OFF", 0), ("ON", 0)]
    assert "no partner in arm NATIVE of block pair 0" in missing.refusals[0].reason


def test_pairs_of_different_arms_and_sizes_pair_each_treatment_with_their_own_off() -> None:
    """A merge of an OFF-ON-NATIVE run with an OFF-ON and an OFF-NATIVE run: block_pairs
    says which blocks form each pair, so each treatment pairs with the OFF of its own pair
    (derived as pairs of one size, pair 1's blocks would be OFF-OFF-NATIVE and ON's
    observations in it strays)."""
    from pytest_sharedkv.perf.pairing import arm_pairs, pair_layout

    blocks = ["OFF", "ON", "NATIVE", "OFF", "ON", "OFF", "NATIVE"]
    layout = [0, 0, 0, 1, 1, 2, 2]
    data = [obs("OFF", 0, pair=0, ttft_s=2.0), obs("ON", 1, pair=0, ttft_s=0.5),
            obs("NATIVE", 2, pair=0, ttft_s=1.5), obs("OFF", 3, pair=1, ttft_s=2.4),
            obs("ON", 4, pair=1, ttft_s=0.6), obs("OFF", 5, pair=2, ttft_s=1.0),
            obs("NATIVE", 6, pair=2, ttft_s=0.9)]
    pairing = pair_observations(data, blocks, layout)
    assert pairing.ok, pairing.refusals
    assert sorted((p.pair, p.arms, p.control.block, p.ratio) for p in pairing.pairs) == [
        (0, "NATIVE/OFF", 0, 0.75), (0, "ON/OFF", 0, 0.25), (1, "ON/OFF", 3, 0.25),
        (2, "NATIVE/OFF", 5, 0.9)]
    assert arm_pairs(blocks, layout) == {"OFF": 3, "ON": 2, "NATIVE": 2}
    assert pair_layout(blocks) == [0, 0, 0, 1, 1, 1, 2]  # what the field replaces
    assert not pair_observations(data, blocks).ok
    # a block of a two-block pair that recorded nothing refuses its partner, as before
    missing = pair_observations(data[:-1], blocks, layout)
    assert [(r.arm, r.pair) for r in missing.refusals] == [("OFF", 2)]
    assert "no partner in arm NATIVE of block pair 2" in missing.refusals[0].reason


def test_a_pair_without_off_is_refused() -> None:
    """OFF is the control of every ratio: a pair of two treatments is not paired (NATIVE
    over ON would be no ratio the screening means)."""
    pairing = pair_observations([obs("ON", 0, pair=0), obs("NATIVE", 1, pair=0)],
                                ["ON", "NATIVE"], [0, 0])
    assert not pairing.pairs and len(pairing.refusals) == 2
    assert "no control: block pair 0 holds no OFF block (ON-NATIVE)" in \
        pairing.refusals[0].reason
    stray = pair_observations([obs("OFF", 0), obs("NATIVE", 1)], ["OFF", "ON"], [0, 0])
    assert "holds the arms OFF, ON, NATIVE, but its blocks ran OFF-ON" in \
        stray.refusals[0].reason


def test_an_old_report_without_block_pairs_pairs_as_before() -> None:
    """Reports written before block_pairs read as consecutive pairs of one size: the same
    pairs as the layout recorded today, for two and three arms alike."""
    from pytest_sharedkv.perf.pairing import pair_layout

    two = ["OFF", "ON", "ON", "OFF", "OFF", "ON"]
    assert pair_layout(two) == [0, 0, 1, 1, 2, 2]
    three = ["OFF", "ON", "NATIVE", "NATIVE", "ON", "OFF"]
    assert pair_layout(three) == [0, 0, 0, 1, 1, 1]
    data = [obs(arm, block, pair=block // 3) for block, arm in enumerate(three)]
    assert pair_observations(data, three).pairs == \
        pair_observations(data, three, pair_layout(three)).pairs
