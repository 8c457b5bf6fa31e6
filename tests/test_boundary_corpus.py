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
