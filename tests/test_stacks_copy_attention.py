"""The attention-only copy model (for the in-process connector, which vLLM 0.26 will not run
with a hybrid model): deterministic weights and digest, the hybrid's vocabulary, shift heads
that single out their distance over the whole context, and on CPU with transformers the
copy rule's answers, the corruption matrix's attention rows (a lost or foreign source chunk
changes the answer; noise, another chunk, permuted chunks do not), and the rule across a
distance of 200k positions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers", reason="the copy model is checked with transformers")

# The digest of AttentionCopyRecipe() as make_attention_copy_model writes it: the same on
# every machine (no random numbers, no matrix products); a change here is a new model.
DIGEST = "32823e049a97c0ba"
ATTENTION_ROWS = ("clean", "noise-1ulp", "lost-other-chunk", "permuted-chunks",
                  "lost-source-chunk", "foreign-source-chunk")
STEPS = 8


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pytest_sharedkv.models.copy_attention_model import make_attention_copy_model

    return make_attention_copy_model(tmp_path_factory.mktemp("copy-attention")).path


@pytest.fixture(scope="module")
def requests() -> list[tuple[str, list[int], int, int]]:
    from pytest_sharedkv.corpus import copy_corpus

    made = copy_corpus.build(32, plan=(("1k", 1000, 2, 0),), sessions=0)
    return [(r.id, [0, *made.words(r)], r.source_chunk, r.source) for r in made.measured()]


def test_digest_and_vocabulary(model_dir: Path) -> None:
    from pytest_sharedkv.models.copy_attention_model import KIND, AttentionCopyRecipe
    from pytest_sharedkv.models.copy_model import (
        CopyModelRecipe,
        _tokenizer_spec,
        digest_of,
        model_kind,
        vocabulary,
    )

    assert digest_of(model_dir) == DIGEST
    assert model_kind(model_dir) == KIND
    assert vocabulary(AttentionCopyRecipe().vocabulary_recipe()) == vocabulary(
        CopyModelRecipe())  # one vocabulary: the copy corpus serves both models
    spec = json.loads((model_dir / "sharedkv-tokenizer.json").read_text())
    assert spec == json.loads(json.dumps(_tokenizer_spec(CopyModelRecipe())))


def test_shift_heads_single_out_their_distance_over_the_whole_context() -> None:
    from pytest_sharedkv.models.copy_attention_model import (
        AttentionCopyRecipe,
        shift_curve,
        shift_gap,
        shift_peak,
    )

    recipe = AttentionCopyRecipe()
    assert shift_gap(recipe) * shift_peak(recipe) > 40  # nats over every other distance
    # a head reaching back past <s> lands on <s> (no code), not on a token after it
    nearer = shift_curve(recipe, range(-5, 0))
    assert nearer == sorted(nearer)


def _greedy(model: Any, ids: list[int], positions: list[int], steps: int) -> list[int]:
    """Greedy answer of IDS at POSITIONS, each step on the whole sequence (an explicit
    mask: without one transformers reads a jump in positions as packed sequences)."""
    import torch

    ids, positions = list(ids), list(positions)
    out = []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([ids]),
                           attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                           position_ids=torch.tensor([positions]), use_cache=False).logits
            token = int(logits[0, -1].argmax())
            out.append(token)
            ids.append(token)
            positions.append(positions[-1] + 1)
    return out


def test_answers_follow_the_copy_rule_and_the_matrix(
        model_dir: Path, requests: list[tuple[str, list[int], int, int]]) -> None:
    from pytest_sharedkv.models.copy_matrix import run_matrix, table
    from pytest_sharedkv.models.copy_rule import continue_ids

    rows = run_matrix(model_dir, requests, chunk=32, corruptions=ATTENTION_ROWS, steps=STEPS)
    print("\n".join(table(rows)))
    assert [r.corruption for r in rows] == [*ATTENTION_ROWS] * len(requests)
    wrong = [f"{r.corruption} on {r.request}: changed={r.changed}" for r in rows
             if not r.as_expected]
    assert not wrong, wrong
    for (_, ids, _, _), row in zip(requests, rows[::len(ATTENTION_ROWS)], strict=True):
        assert row.corruption == "clean" and row.margin > 50
        assert list(row.answer) == continue_ids(ids, STEPS, miss=4)


def test_the_rule_holds_across_200k_positions(
        model_dir: Path, requests: list[tuple[str, list[int], int, int]]) -> None:
    """The prompt's second half placed 200k positions after its first (attention needs no
    contiguous positions): the cue finds its source across that distance, in bf16."""
    from pytest_sharedkv.models.copy_matrix import CopyRunner
    from pytest_sharedkv.models.copy_rule import continue_ids

    model = CopyRunner(model_dir).model  # bf16, as the matrix runs it
    _, ids, _, source = requests[0]
    cut = (source + 64 + len(ids) - 16) // 2  # between the source's words and the cue
    positions = [i if i < cut else i + 200_000 for i in range(len(ids))]
    assert _greedy(model, ids, positions, STEPS) == continue_ids(ids, STEPS, miss=4)
