"""The plugin's version (pyproject.toml's), importable without the entry point."""

__version__ = "0.1.0"
