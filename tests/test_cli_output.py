"""Every file a subcommand writes (``compare --markdown``, ``merge-screenings OUT``) goes
through ``cli.output``: an output that is one of the inputs is refused under any name (the
same path, ``./``, a symlink, a hard link), an existing one unless ``--force``, each with
exit 2 and one line naming the option and the file; nothing given is ever lost, and a
written file is whole. In-process: the commands' ``main``."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_sharedkv.cli.compare.main import main as compare_main
from pytest_sharedkv.cli.merge import main as merge_main
from pytest_sharedkv.cli.output import Output, OutputError

H200 = Path(__file__).resolve().parents[1] / "fixtures" / "perf" / "h200"
S1, S2 = H200 / "perf-27b-compiled-s1.json", H200 / "perf-27b-compiled-s2.json"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """Two real screenings as a.json and b.json in the working directory (for ./ paths)."""
    monkeypatch.chdir(tmp_path)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_bytes(S1.read_bytes())
    b.write_bytes(S2.read_bytes())
    return a, b


def _hard_link(b: Path) -> str:
    os.link(b, b.with_name("hard.json"))
    return "hard.json"


def _symlink(b: Path) -> str:
    b.with_name("soft.json").symlink_to(b.name)
    return "soft.json"


# How an output can name the input b.json: (the name, what the message says)
NAMES: list[tuple[str, Callable[[Path], str], str]] = [
    ("path", lambda b: "b.json", "the same path"),
    ("dot", lambda b: "./b.json", "the same path"),
    ("parent", lambda b: f"../{b.parent.name}/b.json", "the same path"),
    ("symlink", _symlink, "through a symlink"),
    ("hard link", _hard_link, "a hard link to it"),
]


def _run(command: str, out: str, force: bool) -> int:
    extra = ["--force"] if force else []
    if command == "compare":
        return compare_main(["a.json", "b.json", "--markdown", out, *extra])
    return merge_main([out, "a.json", "b.json", *extra])


@pytest.mark.parametrize("command", ["compare", "merge-screenings"])
@pytest.mark.parametrize(("name", "make", "how"), NAMES, ids=[n for n, _, _ in NAMES])
def test_an_input_is_never_replaced_under_any_name(
        inputs: tuple[Path, Path], capsys: pytest.CaptureFixture[str], command: str,
        name: str, make: Callable[[Path], str], how: str) -> None:
    a, b = inputs
    before = digest(a), digest(b)
    out = make(b)
    for force in (False, True):  # --force replaces a file, never an input
        assert _run(command, out, force) == 2
        captured = capsys.readouterr()
        option = "--markdown" if command == "compare" else "OUT.json"
        role = "AFTER.json" if command == "compare" else "IN.json #2"
        assert captured.err.splitlines() == [
            f"python -m pytest_sharedkv {command}: {option}: {Path(out)} is {role} b.json ({how}): "
            "an input is never replaced"]
        assert captured.out == ""
        assert (digest(a), digest(b)) == before


@pytest.mark.parametrize("command", ["compare", "merge-screenings"])
def test_an_existing_output_needs_force_and_is_then_replaced_whole(
        inputs: tuple[Path, Path], capsys: pytest.CaptureFixture[str], command: str) -> None:
    out = inputs[0].with_name("out.txt")
    out.write_text("keep me\n")
    out.chmod(0o640)
    assert _run(command, "out.txt", force=False) == 2
    option = "--markdown" if command == "compare" else "OUT.json"
    assert capsys.readouterr().err == (f"python -m pytest_sharedkv {command}: {option}: "
                                       "out.txt exists (give --force to replace it)\n")
    assert out.read_text() == "keep me\n"
    assert _run(command, "out.txt", force=True) == 0
    printed = capsys.readouterr().out
    text = out.read_text()
    assert text.startswith("# sharedkv compare" if command == "compare" else "{")
    if command == "compare":
        assert text == printed
    assert out.stat().st_mode & 0o777 == 0o640  # the replaced file's mode
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".out.txt")] == []


def test_a_new_output_gets_the_umask_mode_and_no_temp_file_stays(tmp_path: Path) -> None:
    out = tmp_path / "new.md"
    Output(out, "--markdown", False, ()).write("text\n")
    umask = os.umask(0)
    os.umask(umask)
    assert out.read_text() == "text\n" and out.stat().st_mode & 0o777 == 0o666 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.md"]


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out.md"
    out.write_text("old\n")

    def refuse(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OutputError, match=r"^--markdown: cannot write .*out\.md \(No space"):
        Output(out, "--markdown", True, ()).write("new\n")
    assert out.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.md"]


def test_an_output_in_a_missing_directory_is_one_line(
        inputs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert _run("compare", "nowhere/out.md", force=False) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m pytest_sharedkv compare: --markdown: cannot write "
                          "nowhere/out.md (") and len(err.splitlines()) == 1
    assert "Traceback" not in err
