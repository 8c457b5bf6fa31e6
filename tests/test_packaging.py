"""What the sdist and the wheel hold, read from the packaging configuration by setuptools
itself, without building (a build takes half a minute; .ci/run builds both, runs twine
check and installs the wheel into a fresh venv). The version is written once; every package
of the plugin ships (pyproject lists them, because the suite and its data are mapped in
from suites/ and fixtures/); the wheel holds LICENSE, the engine hooks' sitecustomize.py,
the service corpus and every stored reference, and no directory of data that setuptools
would take for an unlisted package; the sdist holds the self-tests whole, with what they
read."""

from __future__ import annotations

import ast
import contextlib
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tomllib

import pytest_sharedkv
from pytest_sharedkv import version

ROOT = Path(__file__).resolve().parents[1]
# What the sdist carries beside the package for the self-tests (MANIFEST.in says why);
# docs/ stays out on purpose.
SELF_TEST_TREES = ("tests", "fixtures", "contrib", "benchmarks")
SELF_TEST_FILES = ("conftest.py", "tox.ini", "LICENSE", "CHANGELOG.md", "README.md",
                   "ARCHITECTURE.md", "pyproject.toml")


@dataclass(frozen=True)
class Contents:
    config: dict[str, Any]
    version: str
    license_files: list[str]
    wheel: set[str]  # paths inside the wheel, besides its .dist-info
    sdist: set[str]  # paths inside the sdist, from its root
    include_package_data: bool


def on_disk(*trees: str) -> set[str]:
    return {str(p.relative_to(ROOT)) for tree in trees for p in (ROOT / tree).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


@pytest.fixture(scope="module")
def contents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Contents]:
    """The file lists as setuptools computes them for build_py (the wheel) and egg_info's
    manifest (the sdist), from the repository root, writing only under a temp dir."""
    setuptools = pytest.importorskip("setuptools")
    if tuple(int(p) for p in setuptools.__version__.split(".")[:2]) < (77, 0):
        pytest.fail(f"setuptools {setuptools.__version__} cannot read this pyproject "
                    "(license as an SPDX expression needs 77): the dev extra asks for >= 77")
    from setuptools.config.pyprojecttoml import apply_configuration  # type: ignore[import-untyped]
    from setuptools.dist import Distribution  # type: ignore[import-untyped]

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        # A build's isolated environment has no file finder plugin (setuptools-scm, which
        # lmcache brings here, would add every git-tracked file): the sdist is MANIFEST.in's.
        patch.setattr("setuptools.command.egg_info.walk_revctrl", lambda *_: iter(()))
        dist = Distribution({"script_name": "setup.py"})
        apply_configuration(dist, "pyproject.toml")
        build_py = dist.get_command_obj("build_py")
        build_py.ensure_finalized()
        wheel = {f"{package.replace('.', '/')}/{module}.py"
                 for package, module, _ in build_py.find_all_modules()}
        wheel |= {f"{package.replace('.', '/')}/{name}"
                  for package, _, _, names in build_py.data_files for name in names}
        egg_info = dist.get_command_obj("egg_info")
        egg_info.egg_base = str(tmp_path_factory.mktemp("egg-info"))
        egg_info.ensure_finalized()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            egg_info.run()
        yield Contents(
            config=tomllib.loads((ROOT / "pyproject.toml").read_text()),
            version=dist.get_version(),
            license_files=list(dist.metadata.license_files or []),
            wheel=wheel,
            sdist=set(egg_info.filelist.files),
            include_package_data=bool(dist.include_package_data))


def test_the_version_is_written_once(contents: Contents) -> None:
    """pyproject takes it from version.py, which setuptools reads as a literal (no import of
    the package, so nothing heavy at build time); the plugin reports the same one."""
    project = contents.config["project"]
    assert "version" not in project and "version" in project["dynamic"]
    dynamic = contents.config["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "pytest_sharedkv.version.__version__"}
    tree = ast.parse(Path(version.__file__).read_text())
    (assigned,) = [node.value for node in tree.body if isinstance(node, ast.Assign)
                   and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["__version__"]]
    assert ast.literal_eval(assigned) == contents.version == pytest_sharedkv.__version__


def test_license_ships_in_both(contents: Contents) -> None:
    assert contents.config["project"]["license"] == "Apache-2.0"
    assert contents.license_files == ["LICENSE"]  # the wheel's .dist-info/licenses/LICENSE
    assert "LICENSE" in contents.sdist
    assert "Apache License" in (ROOT / "LICENSE").read_text().splitlines()[1]


def test_the_wheel_holds_the_hooks_corpus_and_references(contents: Contents) -> None:
    assert "pytest_sharedkv/engine_hooks/inject/sitecustomize.py" in contents.wheel
    assert "pytest_sharedkv/py.typed" in contents.wheel
    assert "pytest_sharedkv/suites/test_service_regression.py" in contents.wheel
    data = {path.replace("fixtures/", "pytest_sharedkv/fixtures/", 1)
            for path in on_disk("fixtures/service", "fixtures/snapshots")}
    assert any(path.endswith("copy-corpus-c32.json") for path in data)
    assert len([p for p in data if "/snapshots/" in p]) > 100  # every stored reference
    assert data <= contents.wheel, sorted(data - contents.wheel)[:5]
    # the self-tests' recorded reports go to the sdist only
    assert not [p for p in contents.wheel if p.startswith(("pytest_sharedkv/fixtures/lmcache",
                                                           "pytest_sharedkv/fixtures/perf"))]
    assert not contents.include_package_data


def test_every_package_is_listed(contents: Contents) -> None:
    """Code packages by their __init__.py; directories of data (no __init__.py) are listed
    too, so that setuptools ships them without warning they are absent from `packages`."""
    config = contents.config["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts)
             for p in (ROOT / "pytest_sharedkv").rglob("__init__.py")}
    found |= {"pytest_sharedkv.suites", "pytest_sharedkv.fixtures"}  # mapped in
    assert found <= listed, sorted(found - listed)
    assert config["package-dir"]["pytest_sharedkv.suites"] == "suites"
    assert config["package-dir"]["pytest_sharedkv.fixtures"] == "fixtures"
    for data_package in sorted(listed - found):
        where = data_package.replace(".", "/")
        shipped = [p for p in contents.wheel if (p.rsplit("/", 1)[0] + "/").startswith(where + "/")]
        assert shipped, f"{data_package}: listed, but ships no file"


def test_no_data_directory_is_an_unlisted_package(contents: Contents) -> None:
    """setuptools warns (and will stop shipping) data under a directory whose name Python
    could import but that `packages` does not list: the first directory below a listed
    package must not be such a name."""
    listed = {p.replace(".", "/") for p in contents.config["tool"]["setuptools"]["packages"]}
    for path in sorted(contents.wheel):
        parent = path.rsplit("/", 1)[0]
        if parent in listed:
            continue
        owner = max((p for p in listed if parent.startswith(p + "/")), key=len)
        first = parent[len(owner) + 1:].split("/")[0]
        assert not first.isidentifier(), f"{path}: {owner}/{first} is no listed package"


def test_the_sdist_holds_the_self_tests_whole(contents: Contents) -> None:
    """tests/ with its conftest, helpers and data, and what the self-tests read beside the
    package; its tests collect from an unpacked sdist (.ci/run collects them)."""
    needed = on_disk(*SELF_TEST_TREES) | set(SELF_TEST_FILES)
    assert {"tests/conftest.py", "tests/__init__.py", "tests/h200_logs.py"} <= needed
    assert needed <= contents.sdist, sorted(needed - contents.sdist)[:5]
    assert not [p for p in contents.sdist if p.startswith("docs/")]
