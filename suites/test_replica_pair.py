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

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_sharedkv.options import Settings
    from pytest_sharedkv.records import ResultSink
    from pytest_sharedkv.replicas.namespaces import Namespaces
    from pytest_sharedkv.replicas.pair import ReplicaPair

PROMPTS = 3
MAX_TOKENS = 16


@pytest.mark.replica_pair
def test_cross_replica_hits_give_exact_answers(
    replica_pair: ReplicaPair, kv_namespace: Namespaces, sharedkv_results: ResultSink,
    sharedkv_settings: Settings,
) -> None:
    from pytest_sharedkv.replicas.pair import ReplicaError
    from pytest_sharedkv.replicas.pair_check import cross_replica_round

    try:
        verdict = cross_replica_round(replica_pair, kv_namespace, sharedkv_results, PROMPTS,
                                      MAX_TOKENS, sharedkv_settings.effective_settle_s)
    except ReplicaError as exc:  # a replica died or stopped answering: its log tail says why
        pytest.fail(str(exc), pytrace=False)
    if not verdict.ok:
        pytest.fail(verdict.message, pytrace=False)
