"""The shipped packed_page suite on CPU: LMCache's torch fallback for real, xfails for what
LMCache refuses, skips (failures under --sharedkv-require-gpu) for the CUDA cells."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator

import pytest

# imported here, before any inner run: pytester's in-process runs then keep them loaded
# (a module an inner run first imports is dropped after it, and torch does not import twice)
pytest.importorskip("lmcache", reason="the packed_page suite runs LMCache's own code")
import torch

from tests.golden import assert_golden

PATHS = ("kernel-fallback", "engine-driven", "server", "server-separate")
BASE = ["--pyargs", "pytest_sharedkv.suites", "-m", "packed_page", "-p", "no:cacheprovider"]


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """The inner runs are in-process; on the 2-core CI machine (two xdist workers) torch's
    two intra-op threads per worker contend: filling the 1568-token hybrid replicas took
    2.5-6 s on two threads, 0.7 s on one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.golden
def test_cpu_round_trips_tables_and_xfails(pytester: pytest.Pytester,
                                           fake_gpus: Callable[[str], None]) -> None:
    """The tier's summary as a whole is its golden file (tests/data/terminal/
    packed_page.txt: counts, the skips' reason, the layout x path table with its xfail
    cells, the run's verdict); the report holds what it says."""
    result = pytester.runpytest(
        *BASE, "--sharedkv-layouts=fa-nhd-bf16,gdn-hybrid-flashinfer-1568",
        "--sharedkv-json=report.json")
    result.assert_outcomes(passed=6, xfailed=2, skipped=6)
    assert_golden(result.stdout.str(), "packed_page")
    data = json.loads((pytester.path / "report.json").read_text())
    # the table's cells: fa-nhd-bf16 moved on every path; the hybrid layout on the server
    # paths, LMCache refusing its kv_caches on the others (nothing moved: xfail, its reason
    # says why)
    cells = {(c["key"]["layout"], c["key"]["path"]): (c["passed"], c["trials"])
             for c in data["checks"] if c["key"]["device"] == "cpu"}
    assert cells == {**{("fa-nhd-bf16", path): (1, 1) for path in PATHS},
                     ("gdn-hybrid-flashinfer-1568", "kernel-fallback"): (0, 0),
                     ("gdn-hybrid-flashinfer-1568", "engine-driven"): (0, 0),
                     ("gdn-hybrid-flashinfer-1568", "server"): (1, 1),
                     ("gdn-hybrid-flashinfer-1568", "server-separate"): (1, 1)}
    outcomes = {t["nodeid"].rsplit("[", 1)[1]: (t["outcome"], t["message"])
                for t in data["tests"]}
    xfailed = {k: m for k, (o, m) in outcomes.items() if o == "xfailed"}
    assert sorted(xfailed) == ["gdn-hybrid-flashinfer-1568-engine-driven-cpu]",
                               "gdn-hybrid-flashinfer-1568-kernel-fallback-cpu]"]
    assert re.match(r"LMCache moves hybrid.*LMCache: ValueError: unsupported kv_caches "
                    r"structure", xfailed["gdn-hybrid-flashinfer-1568-engine-driven-cpu]"])
    assert {m for o, m in outcomes.values() if o == "skipped"} == {
        "needs 1 CUDA device, 0 visible (SHAREDKV_FAKE_GPUS)"}
    hybrid = [c for c in data["checks"] if c["key"]["layout"] == "gdn-hybrid-flashinfer-1568"
              and c["trials"] == 1]
    assert {c["key"]["path"] for c in hybrid} == {"server", "server-separate"}
    server = next(c for c in hybrid if c["key"]["path"] == "server")
    assert server["detail"]["moved_pages"] == 15  # 6 attention + 3 x 3 last-of-chunk GDN
    assert "1568 tokens = 49 kernel page(s) of 32" in server["detail"]["layout"]
    strict = pytester.runpytest(*BASE, "--sharedkv-layouts=fa-nhd-bf16", "--sharedkv-require-gpu")
    strict.assert_outcomes(passed=4, failed=3)


def test_unknown_layout_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(*BASE, "--sharedkv-layouts=fa-nhd-bf16,nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --sharedkv-layouts: unknown layout(s) nope; known: *"])


def test_extension_hook_adds_a_layout(pytester: pytest.Pytester,
                                      fake_gpus: Callable[[str], None]) -> None:
    pytester.makeconftest("""
        from pytest_sharedkv.layouts.specs import LayoutSpec

        def pytest_sharedkv_layouts(registry):
            registry.add(LayoutSpec("my-engine-hnd-fp16", "attention", "an engine's own layout",
                                    kv_layout="HND", dtype="float16", num_kv_heads=4,
                                    head_dim=32, block_size=32, num_layers=2))
    """)
    result = pytester.runpytest(*BASE, "--sharedkv-layouts=my-engine-hnd-fp16")
    result.assert_outcomes(passed=4, skipped=3)
