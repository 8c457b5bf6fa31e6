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
