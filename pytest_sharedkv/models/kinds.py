"""Which generated model a directory holds, read from the files each kind writes, so that
``make-model`` never leaves one kind's files mixed into another's directory."""

from __future__ import annotations

from pathlib import Path

KINDS = ("copy", "tiny", "geometry", "27b-compute", "copy-attention", "copy-memory")


def kind_in(path: Path) -> str | None:
    """"copy", "geometry" or "27b-compute" (named in config.json), "tiny" (its recipe
    file), else None."""
    from pytest_sharedkv.models.copy_model import model_kind
    from pytest_sharedkv.models.tiny_model import RECIPE_FILE

    kind = model_kind(path)
    if kind is None and (path / RECIPE_FILE).is_file():
        return "tiny"
    return kind


def refusal(path: Path, kind: str) -> str | None:
    """Why writing a KIND model into PATH would mix it with what is there, or None: PATH is
    absent or empty, or holds a KIND model already (whose files are then overwritten)."""
    if not path.exists():
        return None
    if not path.is_dir():
        return f"{path} is not a directory"
    if not any(path.iterdir()):
        return None
    found = kind_in(path)
    if found == kind:
        return None
    what = f"a {found} model" if found else "files that are no sharedkv model"
    return (f"{path} holds {what}; writing a {kind} model there would leave its files "
            f"behind (give an empty directory, or --force to replace what is there)")


def clear(path: Path) -> None:
    """Remove everything in PATH (``--force``), keeping the directory itself."""
    import shutil

    if not path.is_dir():
        if path.exists() or path.is_symlink():
            path.unlink()
        return
    for entry in path.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
