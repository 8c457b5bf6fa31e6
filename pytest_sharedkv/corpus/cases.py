"""What the service tier sends: cases with a payload and, where known, the answer.

The copy model's corpus knows every answer by construction (``corpus.py``); a user's own
model gets a text corpus with planted codewords (``text_corpus.py``) whose reference is
replica A's cold answer. Both become ``Case`` objects, so the runner and the checks do not
care which model is served.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

Decoder = Callable[[str], tuple[int, ...]]


@dataclass(frozen=True)
class Case:
    id: str
    role: str  # measured | warmup | control | protocol
    size: str
    # the prompt, or how to make it: the copy corpus regenerates a payload from its seed
    # (and checks its digest) when a test first sends it, not for every case of a run
    payload: str | Callable[[], str] = field(repr=False, compare=False)
    sha256: str
    prompt_tokens: int | None = None  # with <s>, when the corpus knows it
    expected: tuple[int, ...] | None = None  # word ids known by construction
    source_chunk: int | None = None
    codeword: str | None = None  # text corpus: what a correct answer contains

    @property
    def text(self) -> str:
        if not isinstance(self.payload, str):
            object.__setattr__(self, "payload", self.payload())  # made once, then kept
        assert isinstance(self.payload, str)
        return self.payload

    @property
    def shareable(self) -> int | None:
        """Prompt tokens a full hit covers (all but the one vLLM recomputes)."""
        return None if self.prompt_tokens is None else self.prompt_tokens - 1


def prompt_size(prompt_tokens: int | None, text: str) -> int:
    """A prompt's tokens where the corpus knows them, else its words (a lower bound that
    needs no tokenizer): what settles and pool sizes are reckoned in."""
    return prompt_tokens or len(text.split())


@dataclass(frozen=True)
class SessionTurn:
    index: int
    replica: str
    text: str
    sha256: str
    prompt_tokens: int | None
    expected: tuple[int, ...] | None
    source_chunk: int | None


@dataclass(frozen=True)
class SessionCase:
    id: str
    turns: tuple[SessionTurn, ...]


@dataclass
class CaseSet:
    """Everything one run sends, and how to read an answer back into word ids."""

    kind: str  # "copy" (answers known by construction) | "text" (reference: A cold)
    chunk: int | None
    cases: list[Case] = field(default_factory=list)
    sessions: list[SessionCase] = field(default_factory=list)
    decode: Decoder | None = None
    zeroed_chunk: int | None = None  # the sensitivity gate's chunk (copy corpus)
    answer_tokens: int = 16
    source: str = ""  # where the corpus came from (committed manifest, generated, ...)

    def by_role(self, role: str) -> list[Case]:
        return [c for c in self.cases if c.role == role]

    def make_payloads(self) -> None:
        """Every case's prompt made now (a pass that sends them all makes them before its
        first request, so no request waits on a payload being generated)."""
        for case in self.cases:
            _ = case.text

    def case(self, case_id: str) -> Case | None:
        return next((c for c in self.cases if c.id == case_id), None)

    def session(self, session_id: str) -> SessionCase | None:
        return next((s for s in self.sessions if s.id == session_id), None)

    def sizes(self) -> list[str]:
        return list(dict.fromkeys(c.size for c in self.cases if c.role == "measured"))


def copy_case_set(corpus: object, source: str,
                  keep: Callable[[str, str], bool] = lambda role, size: True) -> CaseSet:
    """Cases from the copy model's corpus (``service.corpus.Corpus``), those KEEP(role,
    size) accepts (payloads are regenerated from their seeds, so skipping saves time)."""
    from pytest_sharedkv.corpus.copy_corpus import ANSWER, Corpus, zeroed_chunk
    from pytest_sharedkv.models.copy_model import ids_of

    assert isinstance(corpus, Corpus)
    recipe = corpus.recipe
    cases = [Case(r.id, r.role, r.size, functools.partial(corpus.text, r), r.sha256,
                  r.prompt_tokens, r.expected, r.source_chunk)
             for r in corpus.requests if keep(r.role, r.size)]
    sessions = [SessionCase(s.id, tuple(
        SessionTurn(t.index, t.replica, text, t.sha256, t.prompt_tokens, t.expected,
                    t.source_chunk) for t, text in corpus.session_prompts(s)))
        for s in corpus.sessions]
    return CaseSet("copy", corpus.chunk, cases, sessions,
                   decode=lambda text: tuple(ids_of(text, recipe)),
                   zeroed_chunk=zeroed_chunk(corpus), answer_tokens=ANSWER, source=source)


def longest_prompt(cases: CaseSet) -> int:
    """The longest prompt the corpus sends (its cases and session turns), in tokens."""
    longest = max((c.prompt_tokens or 0 for c in cases.cases), default=0)
    return max([longest, *(t.prompt_tokens or 0 for s in cases.sessions for t in s.turns)])
