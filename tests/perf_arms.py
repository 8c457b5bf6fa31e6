"""Screenings of treatments in some block pairs only, made from the seeded screening (the
shapes a merge of OFF-ON runs with an OFF-NATIVE run gives), for the self-tests of pairing,
tables, plots and compare."""

from __future__ import annotations

from dataclasses import replace

from pytest_sharedkv.perf.observations import Observation, PerfRun, SessionObservation


def native_last(run: PerfRun) -> PerfRun:
    """RUN with its last pair's ON block screened as NATIVE instead, pairs recorded: two
    OFF-ON pairs and one OFF-NATIVE pair of the seeded screening."""
    last = len(run.blocks) - 1
    assert run.blocks[last] == "ON", run.blocks

    def moved(o: Observation) -> Observation:
        return replace(o, arm="NATIVE") if o.block == last else o

    def moved_session(s: SessionObservation) -> SessionObservation:
        return replace(s, arm="NATIVE") if s.block == last else s

    return replace(run, blocks=[*run.blocks[:last], "NATIVE"],
                   block_pairs=[b // 2 for b in range(len(run.blocks))],
                   observations=[moved(o) for o in run.observations],
                   sessions=[moved_session(s) for s in run.sessions])


def with_native_pair(run: PerfRun) -> PerfRun:
    """RUN (pairs of OFF-ON, its last pair OFF then ON) and one more pair, OFF-NATIVE, a
    copy of the last: three OFF-ON pairs and one OFF-NATIVE pair."""
    pairs = len(run.blocks) // 2
    first = 2 * (pairs - 1)
    extra = replace(run, blocks=[*run.blocks, "OFF", "ON"],
                    observations=[*run.observations, *(
                        replace(o, block=o.block + 2, pair=pairs) for o in run.observations
                        if o.block >= first)],
                    sessions=[*run.sessions, *(replace(s, block=s.block + 2, pair=pairs)
                                               for s in run.sessions if s.block >= first)])
    return native_last(extra)
