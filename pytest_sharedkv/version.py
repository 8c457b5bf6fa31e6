"""The plugin's version, written only here: pyproject.toml takes it from this assignment
(setuptools reads the literal, without importing the package), and the JSON report and
``pytest_sharedkv.__version__`` import it."""

__version__ = "0.1.0"
