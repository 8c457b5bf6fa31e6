"""``python -m pytest_sharedkv``: the wrapper adds only what the user's run needs, and its
help shows pytest's, sharedkv options included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_sharedkv.__main__ import suite_args


def _main(args: list[str], cwd: Path, env: dict[str, str] | None = None,
          ) -> subprocess.CompletedProcess[str]:
    import os

    full = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "pytest_sharedkv", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=300, check=False)


def test_help_shows_the_wrapper_and_the_sharedkv_options(tmp_path: Path) -> None:
    out = _main(["--help"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: python -m pytest_sharedkv")
    assert "pytest-sharedkv: shared KV-cache integrity" in out.stdout
    assert "--sharedkv-require-gpu" in out.stdout and "--sharedkv-json=PATH" in out.stdout


def test_disabled_plugin_gets_no_sharedkv_option(tmp_path: Path) -> None:
    assert "--sharedkv-json" not in suite_args(["-p", "no:sharedkv"])
    assert "--sharedkv-json" not in suite_args(["-pno:sharedkv"])
    out = _main(["-p", "no:sharedkv", "--collect-only", "-q"], tmp_path)
    assert "sharedkv-json" not in out.stdout + out.stderr
    assert "unrecognized arguments" not in out.stderr


def test_xdist_is_loaded_when_autoload_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    args = suite_args(["-n", "2"])
    assert args[:4] == ["-p", "sharedkv", "-p", "xdist.plugin"]
    assert "xdist.plugin" not in suite_args(["-m", "ordering"])
    assert suite_args(["-p", "xdist", "-n", "2"]).count("xdist.plugin") == 0
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    assert "xdist.plugin" not in suite_args(["-n", "2"])


def test_xdist_run_without_autoload(tmp_path: Path) -> None:
    out = _main(["-n", "2", "-m", "replica_pair", "-k", "cross_replica",
                 "--sharedkv-provider=stub", "--sharedkv-settle-s=0.05", "-p",
                 "no:cacheprovider"], tmp_path, {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "1 passed" in out.stdout


def test_a_tier_with_no_tests_yet_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_sharedkv.config import tiers
    monkeypatch.setattr(tiers, "suite_tiers", lambda: {"ordering", "packed_page"})
    assert tiers.unselected_tier_lines("perf") == [
        "sharedkv: -m 'perf' selected no test: the perf tier has no tests yet (this "
        "version's suite has tests for ordering, packed_page)"]
    assert tiers.unselected_tier_lines("ordering") == []


def test_usage_errors_name_the_wrapper(tmp_path: Path) -> None:
    """pytest.main() calls itself "pytest.main()" in usage errors; the user typed ours."""
    out = _main(["--no-such-option", "-p", "no:cacheprovider"], tmp_path)
    assert out.returncode == 4, out.stderr
    assert "python -m pytest_sharedkv: error: unrecognized arguments: --no-such-option" \
        in out.stderr, out.stderr
    assert "pytest.main()" not in out.stderr


def _fake_tiny(monkeypatch: pytest.MonkeyPatch) -> None:
    """make_model writes its recipe file only (the real one needs transformers). The module
    is the one sys.modules holds, which make-model imports: an in-process inner run that
    imported it earlier leaves a dropped copy as the package's attribute."""
    import importlib
    from types import SimpleNamespace

    tiny_model = importlib.import_module("pytest_sharedkv.models.tiny_model")

    def make_model(dst: Path, recipe: object = None) -> SimpleNamespace:
        dst.mkdir(parents=True, exist_ok=True)
        (dst / tiny_model.RECIPE_FILE).write_text("{}")
        return SimpleNamespace(digest="0" * 16)

    monkeypatch.setattr(tiny_model, "make_model", make_model)


def test_make_model_refuses_a_directory_of_another_kind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from pytest_sharedkv.__main__ import make_model_command

    _fake_tiny(monkeypatch)
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"sharedkv": {"kind": "copy"}}))
    (model / "sharedkv-tokenizer.json").write_text("{}")
    with pytest.raises(SystemExit) as exit_info:
        make_model_command(["--kind", "tiny", str(model)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"{model} holds a copy model" in err and "--force" in err
    assert sorted(p.name for p in model.iterdir()) == ["config.json", "sharedkv-tokenizer.json"]
    # the same kind is rewritten in place; --force replaces another kind's files
    assert make_model_command(["--kind", "tiny", str(model), "--force"]) == 0
    assert [p.name for p in model.iterdir()] == ["sharedkv-recipe.json"]
    assert make_model_command(["--kind", "tiny", str(model)]) == 0
    (model / "notes.txt").write_text("mine")
    (model / "sharedkv-recipe.json").unlink()
    with pytest.raises(SystemExit):
        make_model_command(["--kind", "tiny", str(model)])
    assert "holds files that are no sharedkv model" in capsys.readouterr().err
