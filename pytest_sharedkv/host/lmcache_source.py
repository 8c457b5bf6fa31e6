"""LMCache's source read without importing it: which ``gpu_ops`` helpers reach
``lmcache_memcpy_async``, and whether a ``module:function`` exists.

Importing lmcache imports torch (seconds; on a GPU box it may start CUDA before the lease
has set ``CUDA_VISIBLE_DEVICES``), yet the ordering tier's targets are declared at
collection, the fault-sensitivity hook picks its default targets in every launched process
before anything is imported, and a bad ``SHAREDKV_INJECT_TARGETS`` must be refused at
start. So this finds a module's file through the import system's path finder without
executing any package ``__init__``, and parses it with ``ast``: the one discovery that the
ordering tier and the hook share. Where no source file exists (a compiled module), an
already imported module's code objects are read instead (``co_names``).
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # ast is imported where a file is parsed, not when the plugin loads
    import ast

GPU_OPS = "lmcache.v1.gpu_connector.gpu_ops"
MEMCPY = "lmcache_memcpy_async"
DIRECTION_WORDS = {"d2h": "D2H", "h2d": "H2D"}


@dataclass(frozen=True)
class MemcpyHelper:
    """A ``gpu_ops`` function whose code calls ``lmcache_memcpy_async``."""

    name: str
    directions: tuple[str, ...]  # from its name (d2h / h2d); empty if it does not say

    @property
    def short(self) -> str:
        """``h2d-range`` for ``lmcache_memcpy_async_h2d_range``."""
        return self.name.removeprefix(MEMCPY).strip("_").replace("_", "-") or self.name


def module_file(name: str) -> Path | None:
    """The file that defines module NAME, found without importing it or its packages."""
    loaded = sys.modules.get(name)
    if loaded is not None:
        origin = getattr(loaded, "__file__", None)
        return Path(origin) if origin else None
    parts = name.split(".")
    spec = importlib.machinery.PathFinder.find_spec(parts[0])
    for depth in range(1, len(parts)):
        if spec is None or spec.submodule_search_locations is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(
            ".".join(parts[: depth + 1]), list(spec.submodule_search_locations))
    if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
        return None
    return Path(spec.origin)


def importable(name: str) -> bool:
    return module_file(name) is not None


def _tree(path: Path) -> ast.Module | None:
    import ast

    if path.suffix != ".py":
        return None
    try:
        return ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None


def _bound(statements: list[ast.stmt], names: set[str]) -> bool:
    """Add the names these module-level statements bind; False on ``import *``."""
    import ast

    for node in statements:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return False
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            blocks = [node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])]
            blocks += [h.body for h in getattr(node, "handlers", [])]
            if not all(_bound(block, names) for block in blocks):
                return False
    return True


def defines(module: str, attribute: str) -> bool | None:
    """Whether MODULE binds ATTRIBUTE at its top level; None when that cannot be read."""
    loaded = sys.modules.get(module)
    if loaded is not None:
        return hasattr(loaded, attribute)
    path = module_file(module)
    tree = _tree(path) if path is not None else None
    if tree is None:
        return None
    names: set[str] = set()
    if not _bound(tree.body, names):
        return None
    return attribute in names


def _mentions(node: ast.AST, word: str) -> bool:
    import ast

    return any((isinstance(n, ast.Name) and n.id == word)
               or (isinstance(n, ast.Attribute) and n.attr == word) for n in ast.walk(node))


def _code_mentions(code: types.CodeType, word: str) -> bool:
    return word in code.co_names or any(
        _code_mentions(c, word) for c in code.co_consts if isinstance(c, types.CodeType))


def _helper(name: str) -> MemcpyHelper:
    words = name.lower().split("_")
    return MemcpyHelper(name, tuple(d for w, d in DIRECTION_WORDS.items() if w in words))


@cache
def memcpy_helpers(module: str = GPU_OPS) -> tuple[MemcpyHelper, ...]:
    """The module's functions whose code reaches ``lmcache_memcpy_async`` (empty where
    lmcache is not installed)."""
    import ast

    path = module_file(module)
    tree = _tree(path) if path is not None else None
    if tree is not None:
        return tuple(_helper(node.name) for node in tree.body
                     if isinstance(node, ast.FunctionDef) and node.name != MEMCPY
                     and _mentions(node, MEMCPY))
    loaded = sys.modules.get(module)
    if loaded is None:
        return ()
    return tuple(_helper(name) for name, fn in vars(loaded).items()
                 if isinstance(fn, types.FunctionType) and fn.__module__ == module
                 and name != MEMCPY and _code_mentions(fn.__code__, MEMCPY))
