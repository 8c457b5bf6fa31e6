"""The environment variables that arm a hook in a launched process (``inject/
sitecustomize.py`` reads each), so a launch that sets one through its environment alone
(a triage control's or the fault catalogue's ``server_env``) also puts the hooks on the
process's path: a switch without the path arms nothing, and the cell would say so only as
VOID. Standard library only: the launching side imports it."""

from __future__ import annotations

from collections.abc import Iterable

SWITCHES = (
    "SHAREDKV_INJECT_DELAY_CYCLES",  # delay_hook.CYCLES_ENV
    "SHAREDKV_CORRUPT_CONTROL",  # corrupt_hook.CONTROL_ENV
    "SHAREDKV_INPROCESS_GATE_CONTROL",  # inprocess_gate_hook.CONTROL_ENV
    "SHAREDKV_NATIVE_GATE_CONTROL",  # native_gate_hook.CONTROL_ENV
    "SHAREDKV_SIMPLE_GATE_CONTROL",  # simple_gate_hook.CONTROL_ENV
    "SHAREDKV_KV_AUDIT_DIR",  # kv_audit_hook.DIR_ENV
    "SHAREDKV_SYNC_LOG",  # sync_hook.LOG_ENV
    "SHAREDKV_FAULT_CONTROL",  # fault_hook.CONTROL_ENV
    "SHAREDKV_STREAM_REMEDY",  # stream_remedy_hook.REMEDY_ENV
    "SHAREDKV_WRITE_RACE_DIR",  # write_race_hook.DIR_ENV
)


def arms_a_hook(env: Iterable[tuple[str, str]]) -> bool:
    """Whether ENV (name, value pairs) sets a hook's switch to something."""
    return any(name in SWITCHES and value for name, value in env)
