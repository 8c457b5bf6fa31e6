"""A checkpoint's ``config.json``, read one way: a missing, unreadable or malformed file
is one error that names the file, never a bare traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class ModelConfigError(ValueError):
    """MODEL/config.json cannot be read as a JSON object; the message names the file."""


def read_config(model: Path) -> dict[str, Any]:
    """MODEL's config.json as a dict."""
    path = model / "config.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelConfigError(f"{path}: cannot be read as JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"{path}: holds {type(data).__name__}, not a JSON object")
    return data


def max_position_embeddings(model: Path | None, default: int) -> int:
    """The context the model was built for (its config.json's max_position_embeddings),
    or DEFAULT where no model is known or the config does not say."""
    if model is None:
        return default
    return int(read_config(model).get("max_position_embeddings") or default)
