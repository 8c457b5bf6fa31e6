"""Fault-sensitivity mode's hook: wraps targets as they import, delays before each call,
counts calls, and reaches launched processes through PYTHONPATH (no GPU needed: the delay
is a stand-in here)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_sharedkv.engine_hooks import delay_hook


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


def test_each_delayed_call_is_logged_per_process_role(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "inject.log"
    monkeypatch.setenv(delay_hook.LOG_ENV, str(log))
    monkeypatch.setenv(delay_hook.ROLE_ENV, "server")
    delayed = delay_hook.wrap("m:f", lambda: 7, lambda: None)
    assert delayed() == 7 and delayed() == 7
    monkeypatch.setenv(delay_hook.ROLE_ENV, "replica A")
    delayed()
    assert delay_hook.read_log(log) == {"server": 2, "replica A": 1}
    assert delay_hook.read_log(tmp_path / "missing.log") == {}


def test_fallback_kernels_are_default_targets_and_labels_are_short() -> None:
    targets = delay_hook.parse_targets(None)
    assert "_transfer_per_layer_fused" in targets["lmcache.v1.platform.torch_ops.mp_mem_kernels"]
    assert delay_hook.cycles_label(100000000) == "1e8"
    assert delay_hook.cycles_label(0) == "0"
    assert delay_hook.cycles_label(25000000) == "25000000"


def test_a_delay_that_never_reached_the_server_voids_the_result() -> None:
    assert delay_hook.void_problem({"server": 28, "replica A": 2}, "check") is None
    void = delay_hook.void_problem({"replica A": 2}, "round")
    assert void == ("VOID: the injected delay never ran in the LMCache server (delayed calls "
                    "per process: {'replica A': 2}), so this round cannot expose a "
                    "stream-ordering fault")
    assert "per process: none" in (delay_hook.void_problem({}, "check") or "")


def test_delayed_launches_run_without_cuda_launch_blocking(tmp_path: Path) -> None:
    from pytest_sharedkv.stack.launch.providers import process_env
    from pytest_sharedkv.stack.launch.spec import LaunchSpec

    base = {"CUDA_LAUNCH_BLOCKING": "1", "PATH": "/bin"}
    assert process_env(LaunchSpec(tmp_path), base=base)["CUDA_LAUNCH_BLOCKING"] == "1"
    delayed = process_env(LaunchSpec(tmp_path, inject_delay_cycles=100), base=base)
    assert "CUDA_LAUNCH_BLOCKING" not in delayed


def test_the_fixtures_module_names_the_same_targets_variable() -> None:
    from pytest_sharedkv.stack import fixtures
    assert fixtures.TARGETS_ENV == delay_hook.TARGETS_ENV
