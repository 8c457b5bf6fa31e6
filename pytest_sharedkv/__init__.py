"""pytest-sharedkv: prove a shared KV-cache stack moves KV state correctly.

This module is imported whenever the plugin loads, so it imports nothing heavy
(no torch, lmcache or vllm). ``pytest -p pytest_sharedkv`` registers this module;
the hook below then registers the real hook module under the entry point's name,
so that pytest's entry-point auto-load (which runs after ``-p``) skips it instead
of registering it twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest

from pytest_sharedkv.version import __version__

__all__ = ["PLUGIN_NAME", "__version__", "pytest_addhooks"]

PLUGIN_NAME = "sharedkv"


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    if pluginmanager.get_plugin(PLUGIN_NAME) is None:
        from pytest_sharedkv import plugin
        pluginmanager.register(plugin, PLUGIN_NAME)
