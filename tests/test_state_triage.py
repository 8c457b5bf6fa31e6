"""The recurrent-state triage's cells as data and its verdict (issue 48 item 4): a cell
removes the class only with exact answers, every state load exact and none from a state
A never kept; the verdict names the cells that removed it and no cause where none did."""

from __future__ import annotations

from pytest_sharedkv.service.state_triage import CONTROLS, Outcome, outcome_of, verdict


def test_cells_and_their_flags() -> None:
    names = [c.name for c in CONTROLS]
    assert names == ["steps-every-chunk", "one-sequence", "concurrency-1", "attention-only",
                     "group-per-layer-kind"]
    steps = CONTROLS[0]
    assert steps.args(32) == ("--max-num-batched-tokens", "32", "--max-num-seqs", "1")
    assert CONTROLS[3].model_kind == "copy-attention" and CONTROLS[2].concurrency == 1
    assert CONTROLS[4].requires  # n/a until a release names the setting


def test_outcomes_from_data() -> None:
    assert outcome_of(True, True, 0) is Outcome.REMOVED
    assert outcome_of(True, True, 3) is Outcome.LEFT  # a load no engine kept: not removed
    assert outcome_of(True, False, 0) is Outcome.LEFT
    assert outcome_of(False, True, 0) is Outcome.LEFT
    assert outcome_of(True, None, 0) is Outcome.UNKNOWN
    assert outcome_of(False, None, None) is Outcome.LEFT  # a wrong answer shows it, unjudged
    assert outcome_of(None, True, 0) is Outcome.UNKNOWN


def test_the_verdict_names_only_cells_that_removed_it() -> None:
    line = verdict({"steps-every-chunk": Outcome.REMOVED, "one-sequence": Outcome.LEFT,
                    "concurrency-1": Outcome.LEFT, "attention-only": Outcome.REMOVED,
                    "group-per-layer-kind": Outcome.NOT_APPLICABLE})
    assert line.startswith("RECURRENT STATE TRIAGE: removed by steps-every-chunk: states "
                           "kept only where a scheduler step ends")
    assert "attention-only: the recurrent state itself" in line
    assert "one-sequence left" in line and "group-per-layer-kind n/a" in line
    none = verdict({"steps-every-chunk": Outcome.LEFT})
    assert "no control removed it" in none and "no cause is named" in none
    assert "one-sequence unknown" in none
