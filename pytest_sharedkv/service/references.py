"""Stored reference answers (syrupy): one JSON file per request, in a directory keyed by
the served model and the engine versions, so a pre-upgrade run tells engine drift (replica
A's cold answer is not what this model gave before) from cache-induced divergence (B is
not A, which the request chain tests judge within the run).

``--snapshot-update`` writes the references for this run's key. A run whose key has no
references yet compares against the newest other engine key of the same model (newest by
the versions in the key), and a difference there is reported as ENGINE DRIFT, naming both
keys. The key names the topology where it is not the shared one (``+hosts-<L2 type>``):
a server per replica, or an L1 that evicts, may hit differently, so references of two
topologies never stand in for each other unnamed; likewise the stack where it is not
the MP server (``+inprocess``, ``+native``), and the engine where it is SGLang
(``sglang-<version>+lmcache-...``; the stub double's ``stub+sglang``), never a baseline
for vLLM's keys nor they for it. A snapshot file is named by
its request id and written by the test that owns it, so xdist workers never share a file.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_sharedkv.config.engine import Engine
from pytest_sharedkv.corpus.cases import Case
from pytest_sharedkv.service.answers import ServiceRun
from pytest_sharedkv.stack.pair import ReplicaPair
from pytest_sharedkv.stack.steps import STEPS

if TYPE_CHECKING:
    from packaging.version import Version

    from pytest_sharedkv.host.lmcache_status import LMCacheStatus

REFERENCES = "snapshots"  # under pytest_sharedkv.fixtures (the repository's fixtures/)


def default_root() -> Path:
    from pytest_sharedkv.corpus.choice import fixtures_dir

    return fixtures_dir() / REFERENCES


def installed_problem(root: Path, site_dirs: tuple[Path, ...] | None = None) -> str | None:
    """Why ``--snapshot-update`` must not write into ROOT: it lies in an installed package
    (site-packages), where the next upgrade or reinstall replaces what it wrote and a
    project cannot keep it. None for a checkout (an editable install's fixtures/)."""
    import sysconfig

    if site_dirs is None:
        paths = sysconfig.get_paths()
        site_dirs = tuple(Path(paths[key]) for key in ("purelib", "platlib"))
    where = root.resolve()
    installed = any(where.is_relative_to(d.resolve()) for d in site_dirs) or bool(
        {"site-packages", "dist-packages"} & set(where.parts))
    if not installed:
        return None
    return (f"--snapshot-update would write the service tier's stored references into the "
            f"installed package ({root}), which an upgrade or reinstall replaces; give "
            "--sharedkv-snapshot-dir DIR (or sharedkv_snapshot_dir in the ini file), a "
            "directory your project keeps, e.g. --sharedkv-snapshot-dir sharedkv-snapshots")


def model_key(model: Path | None, kind: str) -> str:
    """copy-<digest> for the copy model; <dir>-<config hash> for a user's checkpoint."""
    if model is None:
        return "copy-rule" if kind == "copy" else "unknown-model"
    from pytest_sharedkv.models.copy_model import digest_of, is_copy_model

    if is_copy_model(model):
        return f"copy-{digest_of(model)}"
    config = hashlib.sha256((model / "config.json").read_bytes()).hexdigest()[:12]
    return f"{model.name}-{config}"


def engine_key(pair: ReplicaPair, lmcache: LMCacheStatus | str) -> str:
    """vllm-<version>+lmcache-<version>-<kernel path> for launched engines: references
    recorded on LMCache's torch fallback and on its compiled kernels never mix. vLLM's
    native offload runs no LMCache, so its key names none: vllm-<version>+native (or
    +native-simple, the other connector)."""
    from pytest_sharedkv.host.environment import dist_version, lmcache_key
    provider = pair.labels.get("provider", "")
    stack = stack_key(pair)
    if engine_of(pair) is Engine.SGLANG:  # SGLang's own references, never vLLM's
        if provider.startswith("stub"):
            return f"stub{topology_key(pair)}{stack}{SGLANG_KEY}"
        return (f"sglang-{dist_version('sglang') or 'none'}+{lmcache_key(lmcache)}"
                f"{topology_key(pair)}{stack}")
    if provider == "vllm":
        engines = f"vllm-{dist_version('vllm')}"
        if stack.startswith("+native"):
            return f"{engines}{topology_key(pair)}{stack}"
        return f"{engines}+{lmcache_key(lmcache)}{topology_key(pair)}{stack}"
    return ("stub" if provider.startswith("stub") else provider or "unknown") \
        + topology_key(pair) + stack


SGLANG_KEY = "+sglang"  # the stub double's key where it answers as SGLang
# --sharedkv-stack values other than mp, and the native stack's other connector
STACK_KEYS = ("inprocess", "native", "native-simple")
SIMPLE_CONNECTOR = "SimpleCPUOffloadConnector"


def stack_key(pair: ReplicaPair) -> str:
    """'' on LMCache's MP server; '+inprocess', '+native' or '+native-simple' where the
    launch record names that stack (and connector): another integration may hit
    differently, so its references are its own."""
    record = getattr(pair, "record", None)  # a pair's stand-in may carry none: the MP's
    stack = record.stack if record is not None else None
    name = stack.get("stack") if stack is not None else None
    if name is None:
        return ""
    if name == "native" and stack is not None and stack.get("connector") == SIMPLE_CONNECTOR:
        name = "native-simple"
    return f"+{name if name in STACK_KEYS else 'unknown'}"


def engine_of(pair: ReplicaPair) -> Engine:
    """The engine a pair's launch record names (an SGLang pair's, or the stub's model of
    one, in its ``stack``); vLLM where it names none, as every launch before SGLang."""
    record = getattr(pair, "record", None)
    stack = (record.stack if record is not None else None) or {}
    return Engine.SGLANG if stack.get("engine") == Engine.SGLANG.value else Engine.VLLM


def same_engine(key: str, other: str) -> bool:
    """Whether two engine keys name one serving engine (sglang-..., stub...+sglang, or
    vLLM's): another engine's answers and hits are no baseline for drift."""
    def sglang(text: str) -> bool:
        return text.startswith("sglang-") or text.endswith(SGLANG_KEY)
    return sglang(key) == sglang(other)


def topology_key(pair: ReplicaPair) -> str:
    """'' in the shared topology; '+hosts-<L2 type>' (server 1's adapter: fs, resp, ...)
    in the hosts topology, '+hosts-unknown' where the L2's type cannot be read."""
    import json

    topology = pair.topology
    if topology is None or not topology.hosts:
        return ""
    try:
        kind = json.loads(topology.spec.adapter).get("type") if topology.spec else None
    except (ValueError, AttributeError):
        kind = None
    return f"+hosts-{kind if isinstance(kind, str) and kind.isidentifier() else 'unknown'}"


def record(run: ServiceRun, case: Case) -> dict[str, Any] | None:
    """What replica A answered cold, and the hits of every step (sorted, rounded)."""
    cold = run.answer(case.id, "cold")
    if cold is None or cold.error:
        return None
    return {
        "payload_sha256": case.sha256,
        "prompt_tokens": cold.prompt_tokens,
        "answer": {"text": cold.text, "ids": list(cold.ids) if cold.ids is not None else None,
                   # -0.0 and 0.0 are one value: + 0.0 makes them one string
                   "logprobs": [round(x, 3) + 0.0 for x in cold.logprobs or ()]},
        "cached_tokens": {s.name: a.cached_tokens for s in STEPS
                          if (a := run.answer(case.id, s.name)) is not None},
    }


def baseline(root: Path, model: str, engine: str) -> Path | None:
    """Another engine key's references for this model, if any: the newest engine by the
    key they were recorded under (engine_order), never by file times, which a checkout
    or a copy sets in any order. Only keys of ENGINE's topology: another topology's hits
    may legitimately differ, so they are no baseline for engine drift."""
    found = [d for d in (root / model).glob("*") if d.is_dir() and d.name != engine
             and same_topology(d.name, engine) and same_stack(d.name, engine)
             and same_engine(d.name, engine)]
    return max(found, key=lambda d: engine_order(d.name)) if found else None


def same_topology(key: str, other: str) -> bool:
    """Whether two engine keys name one topology ('+hosts-<type>' or none)."""
    def topology(text: str) -> str:
        return text[text.index("+hosts-"):] if "+hosts-" in text else ""
    return topology(key) == topology(other)


def same_stack(key: str, other: str) -> bool:
    """Whether two engine keys name one stack ('+inprocess', '+native' or none: the MP
    server's)."""
    def stack(text: str) -> str:
        return next((s for s in sorted((*STACK_KEYS, "unknown"), key=len, reverse=True)
                     if text.endswith(f"+{s}")), "")
    return stack(key) == stack(other)


def engine_order(key: str) -> tuple[bool, Version, Version, str]:
    """How engine keys sort, oldest first: vllm-<version>+lmcache-<version>-<kernel path>
    (or vllm-<version>+native...) by vLLM's version, then LMCache's (none, or a version
    that does not parse, counts as 0); keys of another form (stub, external) before them;
    the key itself breaks a tie."""
    from packaging.version import InvalidVersion, Version

    def version(text: str) -> Version:
        try:
            return Version(text)
        except InvalidVersion:
            return Version("0")

    if not key.startswith("vllm-"):
        return False, version(""), version(""), key
    vllm, _, rest = key.removeprefix("vllm-").partition("+")
    lmcache = rest.removeprefix("lmcache-").split("-", 1)[0] if rest.startswith(
        "lmcache-") else ""  # a native key names no LMCache: 0
    return True, version(vllm), version(lmcache), key


def extension_for(directory: Path) -> type:
    """A syrupy JSON extension that stores every snapshot as DIRECTORY/<name>.json and
    discovers nothing (unused-snapshot cleanup must never delete another size's file)."""
    from syrupy.extensions.json import JSONSnapshotExtension

    class References(JSONSnapshotExtension):
        @classmethod
        def dirname(cls, *, test_location: Any) -> str:
            return str(directory)

        @classmethod
        def get_snapshot_name(cls, *, test_location: Any, index: Any = 0) -> str:
            return str(index)

        def discover_snapshots(self, *, test_location: Any,
                               ignore_extensions: list[str] | None = None) -> Any:
            from syrupy.data import SnapshotCollections

            return SnapshotCollections()

    return References
