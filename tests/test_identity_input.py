"""The identity tier's bad input is a usage error naming the option before any test
(issue 50 item 5): a salt LMCache 0.5.6 refuses ('@', '/', '\\', NUL, over 128
characters: ObjectKey and IPCCacheServerKey's __post_init__), an adapter or model that is
not there, a release site without LMCache; and a release that cannot drive the stack asked
for (the in-process connector under 0.5.7rc2) names the modules that moved (item 3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_sharedkv.host.lmcache_api import release_of, stack_refusal


def fake_site(root: Path, moved: bool) -> Path:
    """A site holding an LMCache 0.5.7rc2-shaped package: the in-process modules under
    lmcache.inprocess (MOVED) or where 0.5.6 keeps them."""
    package = root / "site" / "lmcache"
    places = (["inprocess/integration/vllm/vllm_v1_adapter.py", "inprocess/v1/cache_engine.py",
               "inprocess/v1/manager.py"] if moved else
              ["integration/vllm/vllm_v1_adapter.py", "v1/cache_engine.py", "v1/manager.py"])
    for place in ["__init__.py", *places]:
        (package / place).parent.mkdir(parents=True, exist_ok=True)
        (package / place).write_text("")
    (package / "_version.py").write_text("__version__ = version = '0.5.7rc2'\n")
    return package.parent


@pytest.mark.parametrize(("args", "message"), [
    (["--sharedkv-identity-salt=tenant@1"],
     "--sharedkv-identity-salt: 'tenant@1' holds '@', which LMCache refuses in a cache_salt*"),
    (["--sharedkv-identity-salt=tenant/1"], "--sharedkv-identity-salt: 'tenant/1' holds '/'*"),
    (["--sharedkv-identity-salt=" + "s" * 129],
     "--sharedkv-identity-salt: a cache_salt of 129 characters; LMCache takes at most 128"),
    (["--sharedkv-identity-lora=no-such-adapter"],
     "--sharedkv-identity-lora: */no-such-adapter does not exist; it takes a LoRA adapter "
     "directory holding adapter_config.json"),
    (["--sharedkv-identity-lora=empty"],
     "--sharedkv-identity-lora: */empty holds no adapter_config.json*"),
    (["--sharedkv-identity-model=empty"],
     "--sharedkv-identity-model: */empty holds no config.json*"),
    (["--sharedkv-identity-release-site=empty"],
     "--sharedkv-identity-release-site: */empty holds no lmcache package*"),
])
def test_bad_identity_input_is_a_usage_error_before_any_test(
        pytester: pytest.Pytester, args: list[str], message: str) -> None:
    (pytester.path / "empty").mkdir()
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_inprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
    assert "passed" not in result.stdout.str()


def test_a_salt_of_128_characters_and_a_real_adapter_are_taken(
        pytester: pytest.Pytester) -> None:
    adapter = pytester.path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_inprocess("--sharedkv-identity-salt=" + "s" * 128,
                                          f"--sharedkv-identity-lora={adapter}")
    result.assert_outcomes(passed=1)


def test_a_release_that_moved_the_inprocess_modules_cannot_drive_that_stack(
        pytester: pytest.Pytester) -> None:
    site = fake_site(pytester.path, moved=True)
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_inprocess("--sharedkv-stack=inprocess",
                                          f"--sharedkv-identity-release-site={site}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "ERROR: --sharedkv-identity-release-site: LMCache 0.5.7rc2 (*) cannot drive the "
        "inprocess stack: lmcache.integration.vllm.vllm_v1_adapter moved to "
        "lmcache.inprocess.integration.vllm.vllm_v1_adapter; lmcache.v1.cache_engine moved "
        "to lmcache.inprocess.v1.cache_engine; *"])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_where_each_release_keeps_the_inprocess_modules(tmp_path: Path) -> None:
    moved = fake_site(tmp_path / "new", moved=True) / "lmcache"
    kept = fake_site(tmp_path / "old", moved=False) / "lmcache"
    assert release_of(moved) == "0.5.7rc2"
    assert stack_refusal("inprocess", kept) is None
    assert stack_refusal("mp", moved) is None  # the MP stack imports none of them
    refusal = stack_refusal("inprocess", moved)
    assert refusal is not None and "lmcache.v1.manager moved to lmcache.inprocess.v1.manager" \
        in refusal
    (moved / "inprocess" / "v1" / "manager.py").unlink()
    refusal = stack_refusal("inprocess", moved)
    assert refusal is not None and "lmcache.v1.manager is not there" in refusal
