"""Fault-sensitivity mode's hook: wraps targets as they import, delays before each call,
counts calls, and reaches launched processes through PYTHONPATH (no GPU needed: the delay
is a stand-in here)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

from pytest_sharedkv.replicas import delay_hook


def test_targets_wrapped_on_import_and_called_after_the_delay(tmp_path: Path) -> None:
    (tmp_path / "sharedkv_fake_kv.py").write_text(
        "ORDER = []\n"
        "def store(x):\n    ORDER.append('store'); return x * 2\n"
        "def other():\n    return 1\n")
    sys.path.insert(0, str(tmp_path))
    events: list[str] = []
    finder = delay_hook.install(cycles=5, delay=lambda: events.append("delay"),
                                targets={"sharedkv_fake_kv": ["store"]}, report_at_exit=False)
    try:
        sharedkv_fake_kv = importlib.import_module("sharedkv_fake_kv")
        assert sharedkv_fake_kv.store(21) == 42
        assert events == ["delay"]
        assert sharedkv_fake_kv.ORDER == ["store"]
        assert sharedkv_fake_kv.other() == 1  # untouched
        assert delay_hook.CALLS["sharedkv_fake_kv:store"] == 1
    finally:
        sys.meta_path.remove(finder)  # type: ignore[arg-type]
        sys.modules.pop("sharedkv_fake_kv", None)
        sys.path.remove(str(tmp_path))


def test_off_without_cycles() -> None:
    assert delay_hook.install(cycles=0) is None


def test_parse_targets() -> None:
    assert delay_hook.parse_targets("a.b:f, a.b:g,c:h") == {"a.b": ["f", "g"], "c": ["h"]}
    assert "lmcache.v1.gpu_connector.gpu_ops" in delay_hook.parse_targets(None)


def test_reaches_a_launched_process_through_pythonpath(tmp_path: Path) -> None:
    (tmp_path / "sharedkv_fake_kv2.py").write_text("def store():\n    return 'stored'\n")
    inject = Path(delay_hook.__file__).parent / "inject"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(inject), str(tmp_path), env.get("PYTHONPATH", "")])
    env["SHAREDKV_INJECT_DELAY_CYCLES"] = "1000"
    env["SHAREDKV_INJECT_TARGETS"] = "sharedkv_fake_kv2:store"
    out = subprocess.run([sys.executable, "-c", "import sharedkv_fake_kv2 as m; print(m.store())"],
                         env=env, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "stored"
    assert "sharedkv-inject: fault-sensitivity mode, 1000 cycles" in out.stderr
    assert "sharedkv-inject: delaying sharedkv_fake_kv2:store" in out.stderr
    assert "sharedkv-inject: sharedkv_fake_kv2:store called 1 times" in out.stderr
