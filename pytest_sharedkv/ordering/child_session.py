"""The ordering session in a child process without ``CUDA_LAUNCH_BLOCKING``.

With ``CUDA_LAUNCH_BLOCKING=1`` (LMCache's GPU unit lane sets it) every launch returns only
when its kernel has finished: the imposed delay is over before the copy under test starts,
so no copy can read stale bytes, the negative control is blind, and every cell would be
VOID. The variable is read once, when CUDA starts in a process, so the probes run in a
child started without it; the test process sends it one cell at a time and gets back the
judgement and the records, which land in the test's own sink as if measured here.

    python -m pytest_sharedkv.ordering.child_session   (JSON lines on stdin / stdout)

Copy targets reach the child by their factory's import path (``module:attr``); a target
added by another plugin with a factory that the child cannot import fails with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from dataclasses import asdict, fields
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from pytest_sharedkv.host.cuda_check import LAUNCH_BLOCKING_ENV
from pytest_sharedkv.ordering.cells import Cell
from pytest_sharedkv.report.records import Bundle, ResultSink

if TYPE_CHECKING:
    from pytest_sharedkv.ordering.session import Judgement
    from pytest_sharedkv.ordering.targets import CopyTarget, TargetRegistry
    from pytest_sharedkv.processes.spawn import Launch

TIER = "ordering"
NOTE = (f"{LAUNCH_BLOCKING_ENV}=1 in the environment: probes ran in a child without it (with "
        "it every launch is synchronous, the delay ends before the copy starts, and no "
        "ordering fault could show)")


def target_data(target: CopyTarget) -> dict[str, Any]:
    """A copy target as plain data; a callable factory travels as its import path."""
    data = {f.name: getattr(target, f.name) for f in fields(target)}
    factory = target.factory
    if callable(factory):
        data["factory"] = f"{factory.__module__}:{factory.__qualname__}"
    return data


class ChildSession:
    """The test process's side: same ``judge``/``close`` as ``OrderingSession``."""

    def __init__(self, registry: TargetRegistry, trials: int, delay_cycles: int,
                 sizes: tuple[int, ...], simulated: str | None, log_path: Path) -> None:
        from pytest_sharedkv.processes.spawn import spawn
        env = {k: v for k, v in os.environ.items() if k != LAUNCH_BLOCKING_ENV}
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # plugins' modules
        self.log_path = log_path
        self.log = log_path.open("ab")
        self.launch: Launch = spawn(
            [sys.executable, "-m", "pytest_sharedkv.ordering.child_session"], env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.pending_facts: list[tuple[str, str]] = []
        self.noted = False
        self._send({"targets": [target_data(t) for t in registry], "trials": trials,
                    "delay_cycles": delay_cycles, "sizes": list(sizes),
                    "simulated": simulated})
        self._receive("start")

    def _send(self, message: dict[str, Any]) -> None:
        stdin = self.launch.proc.stdin
        assert stdin is not None
        try:
            stdin.write(json.dumps(message) + "\n")
            stdin.flush()
        except OSError as exc:
            raise self._failure(f"cannot reach it ({exc})") from None

    def _receive(self, what: str) -> dict[str, Any]:
        stdout = self.launch.proc.stdout
        assert stdout is not None
        line = stdout.readline()
        if not line:
            raise self._failure(f"it exited with status {self.launch.proc.wait()} during {what}")
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise self._failure(f"{what} failed:\n{reply['error']}")
        return reply

    def _failure(self, why: str) -> RuntimeError:
        try:
            tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-20:])
        except OSError:
            tail = "(no log)"
        return RuntimeError(f"ordering probe child ({LAUNCH_BLOCKING_ENV} unset there): {why}\n"
                            f"--- last lines of {self.log_path} ---\n{tail}")

    def judge(self, cell: Cell, sink: ResultSink) -> Judgement:
        from pytest_sharedkv.ordering.session import Judgement

        for name, value in self.pending_facts:
            sink.fact(name, value)
        self.pending_facts.clear()
        if not self.noted:
            sink.note(TIER, NOTE)
            self.noted = True
        self._send({"cell": asdict(cell), "nodeid": sink.nodeid})
        reply = self._receive(f"cell {cell.id}")
        sink.bundle.extend(Bundle.from_data(reply["records"]))
        return Judgement(bool(reply["ok"]), str(reply["message"]),
                         str(reply.get("expected", "")))

    def close(self) -> None:
        proc = self.launch.proc
        try:
            if proc.poll() is None:
                self._send({"close": True})
                self._receive("teardown")
        finally:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
            self.launch.forget()
            self.log.close()


def _registry(targets: list[dict[str, Any]]) -> TargetRegistry:
    from pytest_sharedkv.ordering.targets import CopyTarget, TargetRegistry

    registry = TargetRegistry()
    for data in targets:
        data = {**data, "requires": tuple(data["requires"]),
                "directions": tuple(data["directions"]),
                "options": tuple(tuple(o) for o in data["options"])}
        registry.add(CopyTarget(**data))
    return registry


def _serve(setup: dict[str, Any], requests: IO[str], replies: IO[str]) -> None:
    from pytest_sharedkv.config.options import Settings
    from pytest_sharedkv.ordering.session import OrderingSession

    backend: Any
    if setup["simulated"]:
        from pytest_sharedkv.ordering.simulated import BLOCKING_VALUE, SimulatedBackend

        backend = SimulatedBackend(blocking_default_stream=setup["simulated"] == BLOCKING_VALUE)
    else:
        from pytest_sharedkv.ordering.cuda_backend import CudaBackend

        backend = CudaBackend()
    settings = Settings(trials=setup["trials"], delay_cycles=setup["delay_cycles"],
                        sizes=tuple(setup["sizes"]))
    session = OrderingSession(backend, _registry(setup["targets"]), settings)
    reply(replies, {"started": backend.describe()})
    try:
        for line in requests:
            request = json.loads(line)
            if request.get("close"):
                break
            bundle = Bundle()
            try:
                judgement = session.judge(Cell(**request["cell"]),
                                          ResultSink(request["nodeid"], bundle))
            except Exception:
                reply(replies, {"error": traceback.format_exc()})
                continue
            reply(replies, {"ok": judgement.ok, "message": judgement.message,
                            "expected": judgement.expected, "records": bundle.to_data()})
    finally:
        session.close()
    reply(replies, {"closed": True})


def reply(replies: IO[str], message: dict[str, Any]) -> None:
    replies.write(json.dumps(message) + "\n")
    replies.flush()


def main() -> int:
    # The protocol has stdout to itself: anything else printed goes to the log (stderr).
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    setup = json.loads(sys.stdin.readline())
    try:
        _serve(setup, sys.stdin, replies)
    except Exception:
        reply(replies, {"error": traceback.format_exc()})
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
