"""What the compare finds: one word per kind of correctness difference (the table's
"kind" column), mapped from a record's kind and status or from a test's outcome, never
from a message."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_sharedkv.report.records import Word


class Found(Word):
    """A correctness difference's kind, as the table says it."""

    FAILED = "failed"
    ERROR = "error"
    UNFINISHED = "unfinished"
    LOST = "lost"
    INTERRUPTED = "interrupted"
    COLLECTION_ERROR = "collection error"
    VOID = "VOID"
    CONFOUNDED = "CONFOUNDED"
    ISOLATION = "ISOLATION (KV served across cache_salt namespaces)"
    LEAK = ISOLATION  # the older word: an older report's leak reads as the same failure
    DIVERGENCE = "divergence"
    HITS = "hit accounting"
    AUDIT_MISMATCH = "KV audit mismatch"
    PAIRING_REFUSED = "perf pairing refused"
    BELOW_FLOOR = "INVALID (below floor)"
    PARTIAL_HIT = "PARTIAL pool hit"
    KERNEL_PATH_LOST = "kernel path lost"
    SIGHT_LOST = "sight lost"  # a fault class BEFORE's checks saw and AFTER's did not


@dataclass(frozen=True)
class Finding:
    kind: Found
    subject: str  # the test id, or the record's tier and key
    message: str
    # the tier of the test or record it is about (None: the run, a collection error, a
    # note or the perf screening), which says whether BEFORE's tier can be its baseline
    tier: str | None = None

    @property
    def key(self) -> tuple[Found, str]:
        return self.kind, self.subject
