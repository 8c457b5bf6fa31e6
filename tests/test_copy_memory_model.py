"""The memory copy model (issue 48): deterministic weights and digest, the copy rule's
answers, and its corruption matrix on CPU with transformers: a Gated DeltaNet state
zeroed, another prompt's, or from before the first word, resumed at a hit boundary far
from the source, the first word and the end, turns the answer into ``<miss>``; the exact
state leaves it unchanged, and so (the model's stated limit, judged by the state oracle)
does a state one chunk stale after the first word."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the memory copy model is checked with transformers")

# The digest of MemoryCopyRecipe() as make_memory_copy_model writes it; a change is a new model.
DIGEST = "f79376cddbc16313"
CHUNK = 32


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pytest_sharedkv.__main__ import make_model_command

    path = tmp_path_factory.mktemp("copy-memory") / "m"
    assert make_model_command(["--kind", "copy-memory", str(path)]) == 0
    return path


def test_digest_kind_and_corpus(model_dir: Path, tmp_path: Path) -> None:
    from pytest_sharedkv.corpus.choice import variant_recipe
    from pytest_sharedkv.models.copy_memory_model import (
        MemoryCopyRecipe,
        make_memory_copy_model,
    )
    from pytest_sharedkv.models.copy_model import CopyModelRecipe, digest_of
    from pytest_sharedkv.models.kinds import kind_in

    assert digest_of(model_dir) == DIGEST
    assert kind_in(model_dir) == "copy-memory"
    assert variant_recipe(model_dir) == CopyModelRecipe()  # the copy corpus, unchanged
    assert make_memory_copy_model(tmp_path / "s1", MemoryCopyRecipe(seed=1)).digest != DIGEST


def _requests() -> list[tuple[str, list[int], int]]:
    from pytest_sharedkv.corpus.copy_corpus import make_request
    from pytest_sharedkv.models.copy_model import CopyModelRecipe

    out = []
    for i, source_chunk in enumerate((0, 3, 4)):  # before and after the common boundary
        request, words = make_request(f"mem-{i}", "s", f"memory/{i}", 6 * CHUNK + 1, CHUNK,
                                      source_chunk, CopyModelRecipe())
        out.append((request.id, [0, *words], request.source))
    return out


def test_corruption_matrix_far_from_the_source(model_dir: Path) -> None:
    from pytest_sharedkv.models.memory_matrix import EXPECTED_CHANGE, run_memory_matrix, table

    rows = run_memory_matrix(model_dir, _requests(), CHUNK)
    print("\n".join(table(rows)))
    assert {r.corruption for r in rows} == set(EXPECTED_CHANGE)
    wrong = [f"{r.corruption} on {r.request}: {r.answer}" for r in rows if not r.as_expected]
    assert not wrong, wrong
    assert all(r.margin > 40 for r in rows)  # nats between the answer and the runner-up
    changed = [r for r in rows if EXPECTED_CHANGE[r.corruption]]
    assert all(set(r.answer) == {4} for r in changed)  # <miss>, not another word
