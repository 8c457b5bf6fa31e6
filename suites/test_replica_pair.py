"""replica_pair tier: two replicas over one shared LMCache pool give exact answers from
cross-replica hits.

Per allocator (the LMCache server launched with --l1-use-lazy and --no-l1-use-lazy):
replica A answers each long prompt cold (in a fresh namespace: any hit is a leak), then
replica B, a separate engine, answers the same prompt from the shared pool. B must hit the
pool (external hit tokens > 0, or the step proves nothing) and give exactly A's greedy
continuation. With --sharedkv-inject-delay, a delay on the current stream before every KV
transfer turns a latent stream-ordering fault into wrong answers.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_sharedkv.config.options import Settings
    from pytest_sharedkv.corpus.cases import CaseSet
    from pytest_sharedkv.report.records import ResultSink
    from pytest_sharedkv.stack.checks.transfer_provider import TransferCase
    from pytest_sharedkv.stack.namespaces import Namespaces
    from pytest_sharedkv.stack.pair import ReplicaPair

PROMPTS = 3


@pytest.mark.replica_pair
def test_cross_replica_hits_give_exact_answers(
    sharedkv_replica_pair: ReplicaPair, sharedkv_kv_namespace: Namespaces,
    sharedkv_results: ResultSink, sharedkv_settings: Settings, sharedkv_case_set: CaseSet,
) -> None:
    from pytest_sharedkv.replica_pair.round import cross_replica_round
    from pytest_sharedkv.stack.pair import ReplicaError

    pair = sharedkv_replica_pair
    pair.record_launches(sharedkv_results)  # argv and env of what it launched, once
    settle_s = sharedkv_settings.settle_for(pair.delay_cycles)
    try:
        verdict = cross_replica_round(pair, sharedkv_kv_namespace, sharedkv_results,
                                      sharedkv_case_set, PROMPTS, settle_s)
    except ReplicaError as exc:  # a replica died or stopped answering: its log tail says why
        pytest.fail(str(exc), pytrace=False)
    if not verdict.ok:
        pytest.fail(verdict.message, pytrace=False)
    if verdict.unknown:  # neither a pass nor a hit failure: the evidence is missing
        pytest.skip(f"UNKNOWN: {verdict.unknown}")


@pytest.mark.replica_pair
@pytest.mark.sharedkv_requires("lmcache")
def test_transfer_pair_moves_every_byte_through_the_server(
    sharedkv_transfer_case: TransferCase, tmp_path: Path, sharedkv_kv_namespace: Namespaces,
    sharedkv_results: ResultSink,
) -> None:
    """The transfer provider: two processes, no model, the real LMCache server (CPU, or the
    leased GPU per allocator, undelayed and delayed): A stores, B (a fresh process) finds
    every token, a fresh salt finds none, and every byte B retrieves equals A's."""
    from pytest_sharedkv.engine_hooks.delay_hook import cycles_label
    from pytest_sharedkv.stack.checks.transfer_provider import NUM_TOKENS, run_pair

    transfer_case = sharedkv_transfer_case
    outcome = run_pair(tmp_path, sharedkv_kv_namespace("transfer").salt,
                       device=transfer_case.device, allocator=transfer_case.allocator,
                       delay_cycles=transfer_case.delay, faults=transfer_case.faults)
    fetch = outcome.fetch
    kind, status = outcome.verdict()
    sharedkv_results.check(
        "replica_pair",
        {"provider": f"transfer ({transfer_case.device})",
         "allocator": outcome.allocator or transfer_case.allocator,
         "delay": cycles_label(transfer_case.delay)},
        *outcome.score(), message="; ".join(outcome.problems)[:500], kind=kind, status=status,
        detail={"server": outcome.server, "tokens": NUM_TOKENS, "store": outcome.store,
                "fetch": fetch, "delayed_calls": outcome.delayed_calls})
    if outcome.problems:
        pytest.fail("; ".join(outcome.problems), pytrace=False)


@pytest.mark.replica_pair
@pytest.mark.sharedkv_requires("lmcache")
def test_transfer_across_hosts(sharedkv_settings: Settings, tmp_path: Path,
                               sharedkv_kv_namespace: Namespaces, sharedkv_results: ResultSink,
                               request: pytest.FixtureRequest) -> None:
    """The hosts topology's transfer check (model-free, CPU): A stores through server 1,
    B fetches through a server 2 that shares only the session's L2 (--sharedkv-l2), once
    the L2 holds every key: a full hit from the L2 by server 2's own account, byte-exact;
    a byte flipped in the L2 shows as exactly that page wrong; a fault_inject gap trims
    the hit to the chunks before it; a server 2 without the L2 hits nothing."""
    from pytest_sharedkv.config.markers import skip_not_asked
    from pytest_sharedkv.config.options import uses_l2
    from pytest_sharedkv.stack.checks.l2_transfer import check_through, record_verdict

    if not uses_l2(sharedkv_settings):
        skip_not_asked(request.node, "the transfer check across hosts runs in the hosts "
                       "topology (--sharedkv-topology hosts)")
    l2 = request.getfixturevalue("sharedkv_l2")
    outcomes = check_through(l2, tmp_path, sharedkv_kv_namespace("transfer-hosts").salt,
                             sharedkv_settings.l2_fault_gap)
    failed = []
    for name, outcome in outcomes.items():
        kind, status = record_verdict(outcome)
        sharedkv_results.check(
            "replica_pair", {"provider": "transfer (cpu, hosts)", "allocator": "mixed",
                             "delay": "0", "step": f"across hosts: {name}"},
            int(status == "pass"), 1, message="; ".join(p.message for p in outcome.problems)
            [:500] or (outcome.void or ""), kind=kind, status=status,
            role="check" if name == "l2" else "negative-control",
            detail=outcome.as_dict())
        if status != "pass":
            failed.append(f"{name}: " + ("; ".join(p.message for p in outcome.problems)
                                         or str(outcome.void)))
    if failed:
        pytest.fail("\n".join(failed), pytrace=False)


@pytest.mark.replica_pair
@pytest.mark.sharedkv_requires("lmcache")
def test_transfer_write_failure_across_hosts(sharedkv_settings: Settings, tmp_path: Path,
                                             sharedkv_kv_namespace: Namespaces,
                                             sharedkv_results: ResultSink,
                                             request: pytest.FixtureRequest) -> None:
    """A failed L2 write never becomes a wrong answer (model-free, CPU): servers 1 and 2
    store the same prompt at once, as two replicas it reached cold, into a Redis the suite
    starts at its memory limit (noeviction: some writes refused); a server 3 that stored
    nothing then looks it up and retrieves it through that L2. It may miss, or hit only
    what the L2 holds, from the L2, every byte A's: a hit with other bytes fails naming
    the chunk. No write refused is VOID."""
    from pytest_sharedkv.config.markers import skip_not_asked
    from pytest_sharedkv.config.options import uses_l2
    from pytest_sharedkv.stack.checks import l2_transfer
    from pytest_sharedkv.stack.l2 import redis_server
    from pytest_sharedkv.stack.l2.backends import adapter_problem

    if not uses_l2(sharedkv_settings):
        skip_not_asked(request.node, "the write-failure cell across hosts runs in the hosts "
                       "topology (--sharedkv-topology hosts)")
    redis_missing = redis_server.missing()  # no redis-server, or no redis-py to talk to it
    if redis_missing is not None:
        pytest.skip(f"the write-failure cell fills a Redis the suite starts: {redis_missing}")
    missing = adapter_problem("resp")
    if missing is not None:
        pytest.skip(f"the write-failure cell writes through LMCache's resp adapter: "
                    f"{missing.message}")
    outcome = l2_transfer.check_write_failure(
        tmp_path, sharedkv_kv_namespace("transfer-write-failure").salt)
    kind, status = l2_transfer.record_verdict(outcome)
    message = "; ".join(p.message for p in outcome.problems) or (outcome.void or "")
    sharedkv_results.check(
        "replica_pair", {"provider": "transfer (cpu, hosts)", "allocator": "mixed",
                         "delay": "0", "step": "across hosts: write failure"},
        int(status == "pass"), 1, message=message[:500], kind=kind, status=status,
        role="negative-control", detail=outcome.as_dict())
    if status != "pass":
        pytest.fail(f"write failure: {message}", pytrace=False)
