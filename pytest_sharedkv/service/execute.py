"""One pass of the service tier over a replica pair, in stages run on demand: warm-ups
and the sensitivity gate, then each size group by step (with a zero-hit control for each
of its failures), then sessions, then protocol checks.

Tests ask for the stage they read (``Pass.ensure``) and stages run in order, so results
reach pytest's reports (and the JSON report written as the run goes) size by size, and a
run stopped by a time limit keeps what it finished.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pytest_sharedkv.corpus.cases import CaseSet
from pytest_sharedkv.service.answers import ServiceRun
from pytest_sharedkv.service.protocol import run_protocol
from pytest_sharedkv.service.runner import Runner, Salts
from pytest_sharedkv.service.sensitivity import run_gate
from pytest_sharedkv.stack.lmcache_server import STORE_S_PER_TOKEN
from pytest_sharedkv.stack.pair import ReplicaPair

GATE, SESSIONS, PROTOCOL = "gate", "sessions", "protocol"


class Pass:
    def __init__(self, pair: ReplicaPair, cases: CaseSet, salts: Salts, settle_s: float,
                 concurrency: int = 8, log: Callable[[str], None] | None = None,
                 store_s_per_token: float = STORE_S_PER_TOKEN) -> None:
        self.pair = pair
        self.runner = Runner(pair, cases, salts, settle_s, concurrency, log,
                             store_s_per_token)
        self.stages = [GATE, *cases.sizes(), SESSIONS, PROTOCOL]
        self.done: set[str] = set()
        self.started = time.perf_counter()

    @property
    def run(self) -> ServiceRun:
        return self.runner.run

    def ensure(self, stage: str) -> ServiceRun:
        """Run every stage up to STAGE that has not run (unknown stage: all of them)."""
        upto = self.stages.index(stage) if stage in self.stages else len(self.stages) - 1
        for name in self.stages[:upto + 1]:
            if name not in self.done:
                self.done.add(name)
                self._stage(name)
        self.run.wall_s = time.perf_counter() - self.started
        return self.run

    def _stage(self, name: str) -> None:
        runner, cases = self.runner, self.runner.cases
        if name == GATE:
            warmups = cases.by_role("warmup")
            if warmups:
                runner.chain("warm-up", warmups)
            runner.run.gate = run_gate(runner, self.pair.gate_control, self.pair.gate_log)
        elif name == SESSIONS:
            runner.sessions()
        elif name == PROTOCOL:
            runner.run.protocol = run_protocol(runner)
        else:
            group = [c for c in cases.cases if c.role == "measured" and c.size == name]
            runner.chain(name, group)
            runner.zero_hit_controls(group)

