"""The boundary corpus (issue 48 item 3): prompts whose cross-replica hits end mid-prompt.
The committed manifest is what the seed generates; every payload regenerates to its
digest; each B request's hit boundary is what its kind says (the last whole chunk of
what it shares with A's prompt, or the trimmed chunk), kept exactly where A's prefill
ended; each source lies FAR from its boundary; the copy rule gives the expected answer."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pytest_sharedkv.corpus import boundary_corpus as bc
from pytest_sharedkv.corpus.choice import fixtures_dir
from pytest_sharedkv.corpus.copy_corpus import ANSWER, CorpusError
from pytest_sharedkv.models.copy_rule import continue_ids

CHUNK = 32
MANIFEST = fixtures_dir() / "service" / bc.MANIFEST.format(chunk=CHUNK)


def test_the_committed_manifest_is_what_the_seed_generates(tmp_path: Path) -> None:
    committed = bc.load(MANIFEST)
    assert committed == bc.build(CHUNK)
    bc.write(committed, CHUNK, tmp_path / "again.json")
    assert (tmp_path / "again.json").read_text() == MANIFEST.read_text()


def test_boundaries_kept_and_not_sources_far_answers_by_the_rule() -> None:
    requests = bc.load(MANIFEST)
    by_id = {r.id: r for r in requests}
    kinds_seen = {r.kind for r in requests}
    assert kinds_seen == set(bc.KINDS)
    for b in (r for r in requests if r.replica == "B"):
        a = by_id[f"{b.family}/A"]
        a_ids = [0, *bc.words_of(a, CHUNK)]
        b_ids = [0, *bc.words_of(b, CHUNK)]
        common = next((i for i, (x, y) in enumerate(zip(a_ids, b_ids, strict=False))
                       if x != y), min(len(a_ids), len(b_ids)))
        full_hit = common // CHUNK * CHUNK
        if b.kind == "trimmed":
            assert b.trim_chunk is not None and b.boundary == b.trim_chunk * CHUNK < full_hit
        else:
            assert b.boundary == full_hit, b.id
        assert b.kept == (b.boundary == len(a_ids)), b.id  # where A's prefill ended
        assert 0 < b.boundary < len(b_ids) - bc.FAR
        assert b.source + ANSWER + bc.FAR <= b.boundary or b.source >= b.boundary + bc.FAR
        for ids, request in ((a_ids, a), (b_ids, b)):
            assert tuple(continue_ids(ids, ANSWER, 4)) == request.expected, request.id
    kept = [r for r in requests if r.replica == "B" and r.kept]
    assert kept and len(kept) < len(requests) // 2  # controls, and boundaries no engine kept


def test_a_drifted_payload_is_an_error() -> None:
    request = bc.load(MANIFEST)[1]
    with pytest.raises(CorpusError, match="does not hash to the committed digest"):
        bc.words_of(dataclasses.replace(request, sha256="0" * 64), CHUNK)


def test_the_memory_copy_model_shows_a_zeroed_state_at_each_kinds_boundary(
        tmp_path: Path) -> None:
    """B requests on the memory copy model (CPU, transformers), a shared system prompt, a
    turn trimmed inside the previous one and the kept control: resumed at its boundary
    from the exact state each answers as constructed, from a zeroed one it does not, at
    boundaries kept and not kept alike."""
    pytest.importorskip("transformers", reason="the memory copy model runs on transformers")
    import copy

    import torch
    from transformers import DynamicCache

    from pytest_sharedkv.models.copy_matrix import CopyRunner, batched
    from pytest_sharedkv.models.copy_memory_model import make_memory_copy_model
    from pytest_sharedkv.models.memory_matrix import _set_states, _states

    runner = CopyRunner(make_memory_copy_model(tmp_path / "m").path)
    requests = bc.load(MANIFEST)
    picked = [next(r for r in requests if r.kind == kind and r.replica == "B"
                   and r.family.endswith(f"-0{i % 2}"))
              for i, kind in enumerate(("system-prompt", "turn-inside", "turn-extends"))]
    for b in picked:
        ids = [0, *bc.words_of(b, CHUNK)]
        cache = DynamicCache(config=runner.model.config)
        with torch.no_grad():
            runner.model(input_ids=torch.tensor([ids[:b.boundary]]), use_cache=True,
                         **{runner.cache_kw: cache})
        rows = []
        for states in (_states(cache), None):  # exact, zeroed
            row = copy.deepcopy(cache)
            _set_states(row, states)
            rows.append(row)
        merged = batched(rows)
        with torch.no_grad():
            runner.model(input_ids=torch.tensor([ids[b.boundary:-1]] * 2), use_cache=True,
                         **{runner.cache_kw: merged})
        (exact, _), (zeroed, _) = runner.continue_batch(merged, [ids[-1]] * 2, 4)
        assert tuple(exact) == b.expected[:4], b.id
        assert tuple(zeroed) != b.expected[:4], b.id
