"""Sphinx configuration: the Markdown pages under docs/ through MyST.

Built in CI with warnings as errors (``.ci/run``)::

    python -m sphinx -W --keep-going -n -b html docs docs/_build/html

A link to a page or heading that does not exist is a warning, so the build fails on it.
"""

project = "pytest-sharedkv"
extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_heading_anchors = 3
html_theme = "alabaster"
html_title = "pytest-sharedkv"
