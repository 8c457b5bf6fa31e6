"""The service corpus: the committed manifest is what the generator makes from its seed,
every payload hashes as committed, lengths leave one token to recompute, sources cover
every chunk, and session turns never carry their own answer in the history."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pytest_sharedkv.corpus import copy_corpus
from pytest_sharedkv.corpus.choice import bundled_manifest
from pytest_sharedkv.models.copy_model import CopyModelRecipe
from pytest_sharedkv.models.copy_rule import continue_ids, first_divergence


@pytest.fixture(scope="module")
def committed() -> copy_corpus.Corpus:
    return copy_corpus.load(bundled_manifest(32), CopyModelRecipe())


def test_manifest_is_what_the_seed_generates(committed: copy_corpus.Corpus) -> None:
    made = copy_corpus.build(32)
    assert json.dumps(made.to_data(), sort_keys=True) == json.dumps(committed.to_data(),
                                                                    sort_keys=True)


def test_shape_of_the_corpus(committed: copy_corpus.Corpus) -> None:
    measured = committed.measured()
    assert len(measured) == 264
    by_size = {size: [r for r in measured if r.size == size] for size, *_ in copy_corpus.PLAN}
    assert [len(v) for v in by_size.values()] == [200, 40, 16, 8]
    for size, requests in by_size.items():
        lengths = {r.prompt_tokens for r in requests}
        assert len(lengths) == 1
        (n,) = lengths
        assert (n - 1) % 32 == 0, f"{size}: a full hit must leave one token to compute"
    chunks_3k = (by_size["3k"][0].prompt_tokens - 1) // 32
    assert {r.source_chunk for r in by_size["3k"]} == set(range(chunks_3k))
    chunks_128k = (by_size["128k"][0].prompt_tokens - 1) // 32
    assert {r.source_chunk for r in by_size["128k"]} >= {0, chunks_128k - 1}
    assert len({r.sha256 for r in committed.requests}) == len(committed.requests)
    assert [len(s.turns) for s in committed.sessions] == [6] * copy_corpus.SESSIONS
    assert [t.replica for t in committed.sessions[0].turns] == ["A", "B"] * 3


def test_every_payload_hashes_as_committed_and_drift_is_an_error(
        committed: copy_corpus.Corpus) -> None:
    request = committed.by_role("control")[0]
    assert len(committed.text(request).split()) == request.prompt_tokens - 1
    drifted = copy_corpus.Corpus(committed.chunk, committed.recipe,
                            [replace(request, seed=request.seed + "x")])
    with pytest.raises(copy_corpus.CorpusError, match="does not hash to the committed"):
        drifted.words(drifted.requests[0])


def test_session_turns_never_carry_their_own_answer(committed: copy_corpus.Corpus) -> None:
    for session in committed.sessions[:3]:
        for turn, text in committed.session_prompts(session):
            ids = [0, *(int(w[1:]) + 5 for w in text.split())]
            answer = list(turn.expected)
            hits = [i for i in range(len(ids) - len(answer) + 1)
                    if ids[i:i + len(answer)] == answer]
            assert hits == [turn.source], (session.id, turn.index, hits)


def test_copy_rule() -> None:
    miss = 4
    ids = [0, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 30, 31, 10, 11, 12, 13, 14]
    assert continue_ids(ids, 3, miss) == [15, 16, 17]
    assert continue_ids(ids, 1, miss, hidden={6}) == [miss]  # the key copied from is lost
    assert continue_ids([0, 1, 2, 3, 4, 5, 6], 1, miss) == [miss]  # nothing to copy
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([1, 2], [1, 2]) is None
    assert first_divergence([1, 2], [1]) == 1


def test_one_chunk_count_rounds_for_built_documents_and_floors_for_fixed_ones() -> None:
    """chunks_for, the one count: the copy corpus and perf payloads build documents to the
    nearest whole chunk; the text corpus keeps NOMINAL tokens, so only chunks inside count."""
    from pytest_sharedkv.corpus.copy_corpus import chunks_for
    from pytest_sharedkv.perf.payloads import _tokens

    assert chunks_for(3_000, 256) == 12 and chunks_for(3_000, 256, within=True) == 11
    assert chunks_for(8_000, 256) == 31 and chunks_for(8_000, 256, within=True) == 31
    assert chunks_for(100, 256) == 2 and chunks_for(100, 256, within=True) == 2
    assert _tokens("3k", 256, 1 << 30) == 12 * 256 + 1


def test_a_case_set_makes_a_payload_when_it_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building the case set regenerates nothing (a run that sends 3 prompts must not make
    200); reading a case's text makes it once, with the digest still checked."""
    from pytest_sharedkv.corpus.cases import copy_case_set

    corpus = copy_corpus.load(bundled_manifest(32), CopyModelRecipe())
    made: list[str] = []
    real = copy_corpus.Corpus.text

    def counting(self: copy_corpus.Corpus, request: copy_corpus.Request) -> str:
        made.append(request.id)
        return real(self, request)

    monkeypatch.setattr(copy_corpus.Corpus, "text", counting)
    cases = copy_case_set(corpus, "committed")
    assert made == [] and len(cases.cases) > 200
    first = cases.by_role("measured")[0]
    assert first.text == first.text and made == [first.id]
    assert copy_corpus.sha256(first.text) == first.sha256
    tampered = cases.by_role("measured")[1]
    request = next(r for r in corpus.requests if r.id == tampered.id)
    object.__setattr__(request, "sha256", "0" * 64)
    with pytest.raises(copy_corpus.CorpusError, match="does not hash to the committed"):
        _ = tampered.text


def _reference_rule(ids: list[int], steps: int, miss: int, hidden: set[int]) -> list[int]:
    """The copy rule written plainly (an index of every key's positions), for the fast one."""
    from pytest_sharedkv.models.copy_rule import CONTEXT

    seq, index = list(ids), {}  # type: ignore[var-annotated]
    for j in range(CONTEXT, len(seq)):
        if j not in hidden:
            index.setdefault(tuple(seq[j - CONTEXT:j]), set()).add(j)
    out = []
    for _ in range(steps):
        found = {seq[j] for j in index.get(tuple(seq[len(seq) - CONTEXT:]), ())}
        seq.append(found.pop() if len(found) == 1 else miss)
        out.append(seq[-1])
        index.setdefault(tuple(seq[len(seq) - 1 - CONTEXT:len(seq) - 1]), set()).add(
            len(seq) - 1)
    return out


def test_the_copy_rule_is_the_plain_rule_on_random_prompts() -> None:
    """continue_ids builds its index in C (the generator runs it on ~3M tokens); on small
    alphabets (many repeated and disagreeing keys) and hidden positions it answers as the
    plain rule does."""
    import random

    rng = random.Random(7)
    for _ in range(3000):
        alphabet = rng.choice([2, 3, 50])
        ids = [rng.randrange(alphabet) for _ in range(rng.randrange(5, 80))]
        hidden = {rng.randrange(80) for _ in range(rng.randrange(4))}
        steps = rng.randrange(20)
        assert continue_ids(ids, steps, 99, hidden) == _reference_rule(ids, steps, 99, hidden)
