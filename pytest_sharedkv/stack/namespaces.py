"""Cache namespaces: a fresh ``cache_salt`` for every test case (and every size in it).

Prefix caches and LMCache key blocks by tokens and salt; two cases that share a salt and
a prefix make the second one's "cold" request hit. Every namespace is unique to this run,
this test and its label, and a cold request that hits anyway fails and names the leak.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # the replica client (urllib, http.client) loads when a pair is used
    from pytest_sharedkv.stack.pair import Reply

RUN_ID = pytest.StashKey[str]()
# LMCache 0.5.6 refuses a cache_salt with "/" in it (IPCCacheServerKey), and the vLLM engine
# that asked dies (EngineDeadError), as in the perf tier's first ON block on the H200; a
# salt keeps to these characters, the label's others become "."
UNSAFE_SALT = re.compile(r"[^A-Za-z0-9._-]")


@dataclass
class Namespace:
    salt: str
    label: str
    nodeid: str

    def expect_cold(self, reply: Reply) -> None:
        hits = {"cached": reply.cached_tokens, "local": reply.local_hit_tokens or 0,
                "external": reply.external_hit_tokens or 0}
        if any(hits.values()):
            pytest.fail(
                f"namespace leak: a cold request to replica {reply.replica} in namespace "
                f"{self.salt!r} ({self.label} of {self.nodeid}) hit the cache "
                f"({', '.join(f'{k} {v}' for k, v in hits.items())} tokens): another case, or "
                "an earlier run against the same server, used this salt and prefix",
                pytrace=False)


@dataclass
class Namespaces:
    run_id: str
    nodeid: str
    issued: dict[str, Namespace] = field(default_factory=dict)

    def __call__(self, label: str = "default") -> Namespace:
        digest = hashlib.sha256(self.nodeid.encode()).hexdigest()[:10]
        safe = UNSAFE_SALT.sub(".", label)  # still unique: the issue count ends the salt
        salt = f"sharedkv-{self.run_id}-{digest}-{safe}-{len(self.issued)}"
        namespace = Namespace(salt=salt, label=label, nodeid=self.nodeid)
        self.issued[salt] = namespace
        return namespace


def run_id(config: pytest.Config) -> str:
    """One id per process and run (uuid4 + pid: unique across xdist workers and reruns)."""
    if RUN_ID not in config.stash:
        config.stash[RUN_ID] = f"{uuid.uuid4().hex[:8]}{os.getpid():x}"
    return config.stash[RUN_ID]
