"""The step-to-replica map every tier orders its requests by (stack.steps): written once,
read by the service, replica_pair and perf tiers."""

from __future__ import annotations

import pytest

from pytest_sharedkv.stack.steps import OTHER, STEP_NAMES, STEP_REPLICA, STEPS, step


def test_the_steps_go_cold_and_local_on_a_then_cross_and_receiver_local_on_b() -> None:
    assert [(s.name, s.replica, s.hits) for s in STEPS] == [
        ("cold", "A", "none"), ("local", "A", "local"), ("cross", "B", "external"),
        ("receiver-local", "B", "local")]
    assert STEP_NAMES == ("cold", "local", "cross", "receiver-local")
    assert STEP_REPLICA == {"cold": "A", "local": "A", "cross": "B", "receiver-local": "B"}
    assert OTHER == {"A": "B", "B": "A"}


def test_a_step_is_found_by_name_and_an_unknown_name_is_refused_by_name() -> None:
    assert step("cross") is STEPS[2]
    with pytest.raises(KeyError, match="no step 'warm'"):
        step("warm")


def test_the_tiers_read_the_one_map() -> None:
    from pytest_sharedkv.perf import observations
    from pytest_sharedkv.replica_pair import round as replica_round

    assert observations.STEPS == STEP_NAMES
    assert (replica_round.COLD.replica, replica_round.CROSS.replica) == ("A", "B")
