"""cache_salt namespaces: unique per issue, and made only of characters LMCache accepts (its
0.5.6 server refuses "/", which killed the engine of the perf tier's first ON block on the
H200; the stub refuses it too, so the CPU self-tests catch a salt that would)."""

from __future__ import annotations

from pytest_sharedkv.stack.namespaces import UNSAFE_SALT, Namespaces


def test_labels_with_slashes_give_safe_distinct_salts() -> None:
    issue = Namespaces("run1", "suites/test_perf.py::test_screening[vllm]")
    salts = [issue(label).salt for label in ("block-1/warm-0-A", "block-1.warm-0-A",
                                             "w4/alternating/session-00", "a b:c")]
    assert all(not UNSAFE_SALT.search(salt) for salt in salts)
    assert len(set(salts)) == len(salts)
    assert issue.issued[salts[0]].label == "block-1/warm-0-A"  # the label is kept as given
