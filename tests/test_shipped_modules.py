"""What the package ships is what it uses: every module of pytest_sharedkv/ (and of the
suites it ships) is reached from the package itself, imported by another of its modules or
named in one (a dotted name, or a file name a launched process runs). A module only a
self-test uses belongs under tests/ (as tests/disk_tier.py does), not in the wheel."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# reached from outside the package: `python -m pytest_sharedkv`, and the maintainers'
# `python -m pytest_sharedkv.config.options_doc` (it writes docs/options.md from the table),
# and the LMCache #4991 write-race cell's report writer (docs/field-reports.md's command)
ENTRY_POINTS = {"pytest_sharedkv.__main__", "pytest_sharedkv.config.options_doc",
                "pytest_sharedkv.stack.l2_write_race"}
# Issue 48's definitions that no stage runs yet (the mid-prompt boundary corpus and the
# recurrent-state triage's cells): product code whose wiring is that open work, named
# here so that the list shrinks, never grows unnoticed
PENDING = {"pytest_sharedkv.corpus.boundary_corpus", "pytest_sharedkv.service.state_triage"}
DOTTED = re.compile(r"pytest_sharedkv(?:\.\w+)+")
FILE = re.compile(r"(\w+)\.py\b")


def _module(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = ["pytest_sharedkv", "suites", *rel.parts[1:]] if rel.parts[0] == "suites" \
        else list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _references(path: Path, module: str) -> set[str]:
    """The modules PATH imports (each imported name too: it may be a module) and the
    dotted names and file names its strings hold."""
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] \
                if node.level else []
            source = ".".join([*base, *([node.module] if node.module else [])])
            found.add(source)
            found.update(f"{source}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.update(DOTTED.findall(node.value))
            found.update(f"file:{name}.py" for name in FILE.findall(node.value))
    return found


def unused_modules(root: Path = ROOT) -> list[str]:
    """The shipped modules (pytest_sharedkv/, suites/) that nothing shipped imports or
    names, entry points aside."""
    paths = sorted([*(root / "pytest_sharedkv").rglob("*.py"), *(root / "suites").rglob("*.py")])
    modules = {path: _module(path, root) for path in paths}
    reached: set[str] = set()
    for path, module in modules.items():
        reached |= {name for name in _references(path, module) if name != module}
    return [module for path, module in modules.items()
            if path.name != "__init__.py" and not module.startswith("pytest_sharedkv.suites.")
            and module not in ENTRY_POINTS and module not in reached
            and f"file:{path.name}" not in reached]


def test_every_shipped_module_is_used_by_the_package() -> None:
    unused = unused_modules()
    assert [m for m in unused if m not in PENDING] == []
    assert set(unused) == PENDING, f"wired since, off the pending list: {PENDING - set(unused)}"


def test_a_module_only_a_self_test_imports_is_named(tmp_path: Path) -> None:
    package = tmp_path / "pytest_sharedkv"
    (package / "stack").mkdir(parents=True)
    (tmp_path / "suites").mkdir()
    (package / "__init__.py").write_text("")
    (package / "plugin.py").write_text("from pytest_sharedkv.stack import pair\n"
                                       "HOOK = 'pytest_sharedkv.stack.hook'\n")
    (package / "stack" / "__init__.py").write_text("")
    (package / "stack" / "pair.py").write_text("from . import launcher\n")
    (package / "stack" / "launcher.py").write_text("from .. import plugin\n")
    (package / "stack" / "hook.py").write_text("")
    (package / "stack" / "disk_tier.py").write_text("from pytest_sharedkv.stack import pair\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_disk.py").write_text("from pytest_sharedkv.stack import "
                                                     "disk_tier\n")
    assert unused_modules(tmp_path) == ["pytest_sharedkv.stack.disk_tier"]
