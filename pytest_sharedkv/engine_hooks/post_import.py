"""Wrap functions of a module when it is first imported, in a process the suite launched.

A module that does ``from x import f`` binds ``f`` when it runs, so patching ``x.f``
afterwards misses it; patching ``x`` right after ``x`` executes (a meta-path finder whose
loader patches on ``exec_module``) catches every importer. Nothing is imported early.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

Wrapper = Callable[[str, Callable[..., Any]], Callable[..., Any]]  # (module:attr, fn) -> fn
MARK = "__sharedkv_wrapped__"


def patch_module(module: ModuleType, attributes: Sequence[str], wrapper: Wrapper,
                 tag: str) -> list[str]:
    """Wrap MODULE's ATTRIBUTES once per TAG; returns the names wrapped now."""
    patched = []
    for attribute in attributes:
        fn = getattr(module, attribute, None)
        if callable(fn) and tag not in getattr(fn, MARK, ()):
            name = f"{module.__name__}:{attribute}"
            wrapped = wrapper(name, fn)
            setattr(wrapped, MARK, (*getattr(fn, MARK, ()), tag))
            setattr(module, attribute, wrapped)
            patched.append(name)
    return patched


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, attributes: Sequence[str],
                 wrapper: Wrapper, tag: str, verb: str) -> None:
        self.inner = inner
        self.attributes = attributes
        self.wrapper = wrapper
        self.tag = tag
        self.verb = verb

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        for name in patch_module(module, self.attributes, self.wrapper, self.tag):
            print(f"sharedkv-{self.tag}: {self.verb} {name}", file=sys.stderr, flush=True)


class PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self, targets: Mapping[str, Sequence[str]], wrapper: Wrapper,
                 tag: str, verb: str = "wrapping") -> None:
        self.targets = targets
        self.wrapper = wrapper
        self.tag = tag
        self.verb = verb
        self._resolving: set[str] = set()  # other post-import finders call back into us

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.targets or fullname in self._resolving:
            return None
        self._resolving.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self:
                    continue
                find = getattr(finder, "find_spec", None)
                spec: importlib.machinery.ModuleSpec | None = (
                    find(fullname, path, target) if find is not None else None)
                if spec is not None and spec.loader is not None:
                    spec.loader = _PatchingLoader(spec.loader, self.targets[fullname],
                                                  self.wrapper, self.tag, self.verb)
                    return spec
            return None
        finally:
            self._resolving.discard(fullname)


def install(targets: Mapping[str, Sequence[str]], wrapper: Wrapper, tag: str,
            verb: str = "wrapping") -> PostImportFinder:
    """Wrap the targets: modules already imported now, the rest as they load (each logged
    as ``sharedkv-TAG: VERB module:function``)."""
    for module_name, attributes in targets.items():
        loaded = sys.modules.get(module_name)
        if loaded is not None:
            patch_module(loaded, attributes, wrapper, tag)
    finder = PostImportFinder(targets, wrapper, tag, verb)
    sys.meta_path.insert(0, finder)
    return finder
