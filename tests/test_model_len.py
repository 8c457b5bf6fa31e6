"""The served context a launched pair gets (stack.providers.max_model_len), one formula
for the service/replica_pair launcher and the perf tier."""

from __future__ import annotations

import json
from pathlib import Path

from pytest_sharedkv.stack.launch.spec import ANSWER_MARGIN, MIN_MODEL_LEN, max_model_len


def _model(tmp_path: Path, context: int | None) -> Path:
    config = {} if context is None else {"max_position_embeddings": context}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_short_prompts_get_the_floor_and_long_ones_their_length_plus_answer() -> None:
    assert max_model_len(0, 16, None) == MIN_MODEL_LEN
    assert max_model_len(3_073, 32, None) == MIN_MODEL_LEN
    assert max_model_len(8_193, 16, None) == 8_193 + 16 + ANSWER_MARGIN


def test_the_model_context_caps_it_where_the_config_names_one(tmp_path: Path) -> None:
    assert max_model_len(40_000, 16, _model(tmp_path, 32_768)) == 32_768
    assert max_model_len(8_193, 16, _model(tmp_path, 32_768)) == 8_193 + 16 + ANSWER_MARGIN


def test_a_config_without_a_context_leaves_the_need(tmp_path: Path) -> None:
    assert max_model_len(40_000, 16, _model(tmp_path, None)) == 40_000 + 16 + ANSWER_MARGIN


def test_the_launcher_counts_every_prompt_its_corpus_sends() -> None:
    from pytest_sharedkv.corpus.cases import Case, CaseSet, SessionCase, SessionTurn, longest_prompt

    assert longest_prompt(CaseSet("text", 256)) == 0
    cases = [Case("a", "measured", "3k", "x", "", 3_073), Case("b", "measured", "3k", "y", "")]
    turns = (SessionTurn(0, "A", "t", "", 5_000, None, None),
             SessionTurn(1, "B", "u", "", None, None, None))
    assert longest_prompt(CaseSet("copy", 256, cases)) == 3_073
    assert longest_prompt(CaseSet("copy", 256, cases, [SessionCase("s", turns)])) == 5_000
