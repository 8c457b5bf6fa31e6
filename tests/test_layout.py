"""The package layout holds: no circle between packages, no tier importing another tier, the
lower layers importing nothing above them. Read from the code's own imports (every import
statement, function-level ones too), so a move that breaks a rule fails here."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_sharedkv"
TIERS = {"ordering", "packed_page", "pinned_pool", "replica_pair", "service", "perf",
         "identity"}
# Each shared layer and the packages it may import (besides itself). Tiers may import any
# shared layer; top-level modules (plugin wiring) and cli/ sit above everything.
SHARED = {
    "host": set(),
    "processes": {"host"},
    "config": {"host"},
    "report": {"host", "config", "version"},  # version.py: a constant, imports nothing
    "models": {"report"},
    "layouts": {"config", "models"},  # models.config_file reads config.json
    "engine_hooks": {"host", "layouts"},  # the fault hook places faults by object layout
    "corpus": {"config", "models", "layouts"},
    "stack": {"host", "processes", "config", "report", "models", "layouts", "corpus",
              "engine_hooks", "state"},
}


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(root)"


def import_edges(root: Path = PACKAGE) -> dict[str, set[tuple[str, str]]]:
    """package -> {(imported package, 'file: imported module')} for every import."""
    edges: dict[str, set[tuple[str, str]]] = collections.defaultdict(set)
    for path in root.rglob("*.py"):
        rel = path.relative_to(root.parent).with_suffix("")
        here = package_of(".".join(rel.parts)) if len(rel.parts) > 2 else rel.parts[-1]
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                if name.startswith("pytest_sharedkv.") and name.count(".") >= 1:
                    there = package_of(name)
                    if there != here:
                        edges[here].add((there, f"{rel}: {name}"))
    return edges


def rule_breaks(edges: dict[str, set[tuple[str, str]]]) -> list[str]:
    breaks = []
    for here, targets in edges.items():
        for there, where in targets:
            if here in TIERS and there in TIERS:
                breaks.append(f"tier {here} imports tier {there} ({where})")
            elif here in SHARED and there not in SHARED[here]:
                breaks.append(f"{here} imports {there}, above or beside it ({where})")
    for here, targets in edges.items():
        for there, where in targets:
            if any(back == here for back, _ in edges.get(there, ())) and here < there:
                breaks.append(f"circle {here} <-> {there} ({where})")
    return sorted(breaks)


def test_the_layout_has_no_circle_and_no_tier_imports_another() -> None:
    assert rule_breaks(import_edges()) == []


@pytest.mark.parametrize(("source", "expected"), [
    ("from pytest_sharedkv.service.runner import Runner\n", "tier perf imports tier service"),
    ("from pytest_sharedkv.stack.pair import ReplicaPair\n", None),
])
def test_the_checker_sees_a_tier_importing_another(tmp_path: Path, source: str,
                                                   expected: str | None) -> None:
    root = tmp_path / "pytest_sharedkv"
    (root / "perf").mkdir(parents=True)
    (root / "perf" / "blocks.py").write_text(source)
    breaks = rule_breaks(import_edges(root))
    if expected is None:
        assert breaks == []
    else:
        assert len(breaks) == 1 and breaks[0].startswith(expected)


def test_the_checker_sees_a_circle_and_a_layer_reaching_up(tmp_path: Path) -> None:
    root = tmp_path / "pytest_sharedkv"
    for pkg, source in (("report", "from pytest_sharedkv.ordering.summary import x\n"),
                        ("ordering", "from pytest_sharedkv.report.records import Check\n")):
        (root / pkg).mkdir(parents=True)
        (root / pkg / "m.py").write_text(source)
    breaks = rule_breaks(import_edges(root))
    assert any(b.startswith("report imports ordering, above or beside it") for b in breaks)
    assert any(b.startswith("circle ordering <-> report") for b in breaks)


# The rooms of stack/ (issue 49) and the rooms each may import besides the stack's own
# modules at its root ("stack": pair, topology, namespaces, completions, metrics, launch
# records, the LMCache server, ...). The root's modules import no room but the L2 (the
# topology polls it, the server's start reads its log line); fixtures.py, the pytest side
# of them all, imports every room and no room imports it.
STACK_ROOMS = {
    "l2": set(),  # the L2 backends, the Redis server, the L2 log reader
    "stub": {"l2"},  # the test double (stub_openai.py)
    "launch": {"l2", "stub"},  # the providers and stacks behind LaunchSpec (spec.py)
    "checks": {"l2", "launch"},  # the model-free transfer and write-failure checks
}
ROOT_MAY_IMPORT = {"l2"}
# the pytest side imports every room
ROOT_EXCEPTIONS = {"fixtures": set(STACK_ROOMS)}


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_edges(root: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the package's modules it imports (every import statement, function-level
    and TYPE_CHECKING ones too; ``from package import module`` names the module)."""
    modules = {_module_name(p, root): p for p in root.rglob("*.py")}
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules
                           else node.module for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            edges[name] |= {t for t in targets if t in modules and t != name}
    return edges


def module_circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every set of modules that import each other round (Tarjan's components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = [stack.pop()]
            while part[-1] != v:
                part.append(stack.pop())
            if len(part) > 1:
                circles.append(sorted(part))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return circles


def stack_room_breaks(edges: dict[str, set[str]]) -> list[str]:
    """Imports between stack/'s rooms that STACK_ROOMS, ROOT_MAY_IMPORT and
    ROOT_EXCEPTIONS do not allow."""
    def room(module: str) -> str | None:
        parts = module.split(".")
        if parts[:2] != ["pytest_sharedkv", "stack"] or len(parts) < 3:
            return None
        return parts[2] if len(parts) > 3 or parts[2] in STACK_ROOMS else "(root)"

    breaks = []
    for here, targets in edges.items():
        mine = room(here)
        if mine is None:
            continue
        for there in targets:
            theirs = room(there)
            if theirs is None or theirs == mine or (theirs == "(root)" and mine != "(root)" \
                    and there != "pytest_sharedkv.stack.fixtures"):
                continue
            if mine == "(root)":
                allowed = ROOT_EXCEPTIONS.get(here.rsplit(".", 1)[-1], ROOT_MAY_IMPORT)
            else:
                allowed = STACK_ROOMS.get(mine, set())
            if theirs not in allowed:
                breaks.append(f"stack room {mine} imports {theirs} ({here} -> {there})")
    return sorted(breaks)


def test_no_module_imports_itself_round_a_circle() -> None:
    assert module_circles(module_edges()) == []


def test_the_rooms_of_stack_import_only_what_their_table_allows() -> None:
    assert stack_room_breaks(module_edges()) == []


def test_the_checkers_see_a_module_circle_and_a_room_reaching_back(tmp_path: Path) -> None:
    root = tmp_path / "pytest_sharedkv"
    files = {
        "stack/__init__.py": "",
        "stack/pair.py": "from pytest_sharedkv.stack.topology import Topology\n",
        "stack/topology.py": "def f():\n    from pytest_sharedkv.stack.pair import x\n",
        "stack/l2/__init__.py": "",
        "stack/l2/log.py": "from pytest_sharedkv.stack.launch import spec\n",
        "stack/launch/__init__.py": "",
        "stack/launch/spec.py": "from pytest_sharedkv.stack.fixtures import y\n",
        "stack/fixtures.py": "from pytest_sharedkv.stack.launch.spec import LaunchSpec\n",
    }
    for name, source in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(source)
    edges = module_edges(root)
    assert ["pytest_sharedkv.stack.pair", "pytest_sharedkv.stack.topology"] in \
        module_circles(edges)
    breaks = stack_room_breaks(edges)
    assert any(b.startswith("stack room l2 imports launch") for b in breaks)
    assert any(b.startswith("stack room launch imports (root)") and "fixtures" in b
               for b in breaks)
    assert not any("stack room (root) imports launch" in b for b in breaks)  # fixtures may
