"""The plugin parametrizes only its own fixtures (``sharedkv_``-prefixed) in tests of its own
tiers: a downstream project's fixtures of the same short names are left alone."""

from __future__ import annotations

from collections.abc import Callable

import pytest

# Short names the ordering, packed_page, pinned_pool and replica tiers used to own.
USER_FIXTURES = ("ordering_cell", "ordering_session", "packed_case", "packed_page",
                 "pinned_pool", "replica_pair", "transfer_case", "tiny_model",
                 "lmcache_server", "kv_namespace")

DOWNSTREAM_CONFTEST = "import pytest\n" + "".join(
    f"\n@pytest.fixture\ndef {name}():\n    return 'mine: {name}'\n" for name in USER_FIXTURES)


def test_a_users_fixtures_of_the_same_name_are_left_alone(
    pytester: pytest.Pytester, fake_gpus: Callable[[str], None]
) -> None:
    pytester.makeconftest(DOWNSTREAM_CONFTEST)
    pytester.makepyfile(f"""
        import pytest

        NAMES = {USER_FIXTURES!r}

        def test_plain({', '.join(USER_FIXTURES)}):
            assert [{', '.join(USER_FIXTURES)}] == [f"mine: {{n}}" for n in NAMES]

        @pytest.mark.ordering
        def test_marked_with_a_tier(ordering_cell, packed_case):
            assert ordering_cell == "mine: ordering_cell"
            assert packed_case == "mine: packed_case"
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*::test_plain PASSED*", "*::test_marked_with_a_tier PASSED*"])


def test_the_plugin_fixtures_parametrize_tests_of_their_tier(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
    fake_gpus: Callable[[str], None]
) -> None:
    monkeypatch.setenv("SHAREDKV_SIMULATED_STREAMS", "1")
    pytester.makepyfile("""
        import pytest

        @pytest.mark.ordering
        def test_ordering(sharedkv_ordering_cell):
            assert sharedkv_ordering_cell.target.startswith("sim-")

        @pytest.mark.packed_page
        def test_packed(sharedkv_packed_case):
            assert sharedkv_packed_case.layout == "fa-nhd-bf16"

        def test_unmarked(sharedkv_packed_case):
            pass
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--sharedkv-sizes=4KiB",
                                           "--sharedkv-layouts=fa-nhd-bf16")
    # 4 simulated targets x 2 directions x 1 size; 1 layout x 7 (path, device) cells, the
    # 3 CUDA ones skipped here; the unmarked test is not parametrized and says what it lacks
    result.assert_outcomes(passed=8 + 4, skipped=3, errors=1)
    result.stdout.fnmatch_lines(["*sharedkv_packed_case is parametrized only for tests marked "
                                 "@pytest.mark.packed_page*"])
