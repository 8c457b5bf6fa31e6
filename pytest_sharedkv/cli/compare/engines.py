"""An engine change: BEFORE's replicas ran one serving engine and AFTER's another (vLLM ->
SGLang, ``--sharedkv-engine``). The tests and records are the same on both sides, so they
are compared test for test; the line says that a difference is the engine's, not an
upgrade's, as STACK CHANGE says it of a stack.

Read from what the report recorded: ``environment.settings.engine``, else the engine a
"stack" fact names (an SGLang pair's launch record), else the processes it launched (a
``sglang.launch_server`` command line, a ``vllm serve`` one). A report that says none of
these is unknown, and unknown is never called a change. Every report written before the
option ran vLLM where it launched anything, and its launches say so.
"""

from __future__ import annotations

from pytest_sharedkv.cli.compare.reading import Report, setting_of
from pytest_sharedkv.cli.compare.stacks import _launches, _stack_facts
from pytest_sharedkv.config.engine import ENGINE_NAMES, Engine

ENGINE_CHANGE = "ENGINE CHANGE"
SGLANG_SERVER = "sglang.launch_server"


def engine_of(report: Report) -> Engine | None:
    """The engine REPORT's replicas ran; None where it recorded none."""
    setting = setting_of(report, "engine")
    if setting in ENGINE_NAMES:
        return Engine(setting)
    for fact in _stack_facts(report):
        if fact.get("engine") in ENGINE_NAMES:
            return Engine(fact["engine"])
    found: set[Engine] = set()
    for argv, _env in _launches(report):
        if SGLANG_SERVER in argv:
            found.add(Engine.SGLANG)
        elif "serve" in argv and any("vllm" in a for a in argv):
            found.add(Engine.VLLM)
    return next(iter(found)) if len(found) == 1 else None


def engine_change(before: Report, after: Report) -> tuple[Engine, Engine] | None:
    """(BEFORE's engine, AFTER's) where both are known and differ; None otherwise."""
    b, a = engine_of(before), engine_of(after)
    if b is None or a is None or b is a:
        return None
    return b, a


def change_line(found: tuple[Engine, Engine]) -> str:
    before, after = found
    return (f"{ENGINE_CHANGE}: BEFORE ran {before} replicas, AFTER {after}: the same tests are "
            "compared on two engines, so a difference is the engine's, not an upgrade's; "
            "speed is never judged across engines")
