"""The copy model: deterministic weights and digest, a tokenizer that round-trips its
words, and the corruption matrix on CPU with transformers: it sees a lost or foreign
chunk, stale or zeroed Gated DeltaNet state, and that state reset at a hit boundary 3 tokens
before the source (not one far from it), and is blind to 1-ulp noise, to other chunks and
(a limit of attention) to chunks permuted within one prompt."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the copy model is checked with transformers")

# The digest of CopyModelRecipe() as written by make_copy_model: the same on every machine
# (no random numbers, no matrix products); a change here is a new model.
DIGEST = "0413a8badd4d96cf"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pytest_sharedkv.models.copy_model import make_copy_model

    return make_copy_model(tmp_path_factory.mktemp("copy")).path


def test_digest_is_stable(model_dir: Path, tmp_path: Path) -> None:
    from pytest_sharedkv.models.copy_model import CopyModelRecipe, digest_of, make_copy_model

    assert digest_of(model_dir) == DIGEST
    assert make_copy_model(tmp_path / "again").digest == DIGEST
    assert make_copy_model(tmp_path / "seed1", CopyModelRecipe(seed=1)).digest != DIGEST


def test_codes_share_at_most_one_dimension() -> None:
    from pytest_sharedkv.models.copy_model import codes

    table = [set(c) for c in codes()]
    assert len(table) == 64 and all(len(c) == 4 for c in table)
    assert max(len(a & b) for i, a in enumerate(table) for b in table[i + 1:]) == 1


def test_tokenizer_round_trips_words(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    from pytest_sharedkv.models.copy_model import (
        CopyModelRecipe,
        ids_of,
        text_of,
        word_ids,
    )

    recipe = CopyModelRecipe()
    ids = [*word_ids(recipe)][::7]
    text = text_of(ids, recipe)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert tokenizer(text).input_ids == [0, *ids]  # <s> added, one token per word
    assert ids_of(str(tokenizer.decode(ids)), recipe) == ids
    assert ids_of(" <miss> w00", recipe) == [4, 5]


def _requests(count: int) -> list[tuple[str, list[int], int, int]]:
    from pytest_sharedkv.corpus import copy_corpus
    made = copy_corpus.build(32, plan=(("3k", 3000, count, 0),), sessions=0)
    return [(r.id, [0, *made.words(r)], r.source_chunk, r.source) for r in made.measured()]


def test_corruption_matrix(model_dir: Path) -> None:
    from pytest_sharedkv.models.copy_matrix import EXPECTED_CHANGE, run_matrix, table

    rows = run_matrix(model_dir, _requests(3), chunk=32)
    print("\n".join(table(rows)))
    wrong = [f"{r.corruption} on {r.request}: changed={r.changed}" for r in rows
             if not r.as_expected]
    assert not wrong, wrong
    assert {r.corruption for r in rows} == set(EXPECTED_CHANGE)
    clean = [r for r in rows if r.corruption == "clean"]
    assert all(r.margin > 50 for r in clean)  # nats between the answer and the runner-up


def test_fp32_gives_the_bf16_answers(model_dir: Path) -> None:
    """bf16's clean rows come from the whole matrix (the one test_corruption_matrix and the
    shipped suite's model check compute, once per self-test run); fp32 runs them again."""
    from pytest_sharedkv.models.copy_matrix import run_matrix

    requests = _requests(3)
    bf16 = [r for r in run_matrix(model_dir, requests, 32) if r.corruption == "clean"]
    fp32 = run_matrix(model_dir, requests, 32, corruptions=("clean",), dtype="float32")
    assert len(bf16) == len(fp32) == len(requests)
    assert [r.answer for r in bf16] == [r.answer for r in fp32] == [r.expected for r in bf16]


def test_make_model_cli_writes_the_copy_model(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "pytest_sharedkv", "make-model", "--kind",
                          "copy", str(tmp_path / "m")], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"digest {DIGEST}" in out.stdout
