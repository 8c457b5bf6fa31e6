"""The triage's sync control: every wrapped KV transfer is drained before and after, and
logged per process role, so a cell can prove the control ran in the server."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_sharedkv.engine_hooks import sync_hook
from pytest_sharedkv.engine_hooks.delay_hook import ROLE_ENV, read_log


def test_a_wrapped_transfer_is_synchronized_around_and_logged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "sync.log"
    monkeypatch.setenv(sync_hook.LOG_ENV, str(log))
    monkeypatch.setenv(ROLE_ENV, "server")
    events: list[str] = []

    def transfer(x: int) -> int:
        events.append("transfer")
        return x + 1

    wrapped = sync_hook.wrap("m:transfer", transfer, sync=lambda: events.append("sync"))
    assert wrapped(1) == 2
    assert events == ["sync", "transfer", "sync"]
    assert dict(read_log(log)) == {"server": 1}


def test_a_failed_transfer_is_still_synchronized_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sync_hook.LOG_ENV, raising=False)  # no log: nothing written
    events: list[str] = []

    def transfer() -> None:
        events.append("transfer")
        raise RuntimeError("boom")

    wrapped = sync_hook.wrap("m:transfer", transfer, sync=lambda: events.append("sync"))
    with pytest.raises(RuntimeError, match="boom"):
        wrapped()
    assert events == ["sync", "transfer", "sync"]
    assert not list(tmp_path.iterdir())
