"""``python -m pytest_sharedkv``: run the regression suite on whatever hardware is here.

``python -m pytest_sharedkv [run] [PYTEST ARGS...]`` runs the shipped suite
(``pytest --pyargs pytest_sharedkv.suites``) and writes ``sharedkv-report.json`` unless
``--sharedkv-json`` is given. Tiers that need hardware this machine lacks skip with the
reason; the rest run for real.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

DEFAULT_JSON = "sharedkv-report.json"
USAGE = """usage: python -m pytest_sharedkv [run] [PYTEST ARGS...]
       python -m pytest_sharedkv make-model [--kind copy|tiny] DIR [--seed N]

  run (default)   run the regression suite (pytest --pyargs pytest_sharedkv.suites);
                  extra arguments go to pytest, e.g. -m ordering, -n 2, --sharedkv-require-gpu
  make-model      write a model to DIR, offline, deterministic from the seed; prints its
                  digest. --kind copy (default): the KV-sensitive copy model the service
                  tier serves; --kind tiny: the random-weight tiny hybrid model
"""


def make_model_command(args: Sequence[str]) -> int:
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="python -m pytest_sharedkv make-model")
    parser.add_argument("dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kind", choices=("copy", "tiny"), default="copy")
    parsed = parser.parse_args(list(args))
    try:
        if parsed.kind == "copy":
            from pytest_sharedkv.replicas.copy_model import CopyModelRecipe, make_copy_model

            digest = make_copy_model(parsed.dir, CopyModelRecipe(seed=parsed.seed)).digest
        else:
            from pytest_sharedkv.replicas.tiny_model import TinyModelRecipe, make_model

            digest = make_model(parsed.dir, TinyModelRecipe(seed=parsed.seed)).digest
    except ImportError as exc:
        sys.stderr.write(f"make-model needs transformers and tokenizers: {exc}\n")
        return 2
    except OSError as exc:
        sys.stderr.write(f"make-model: cannot write {parsed.dir}: {exc}\n")
        return 2
    sys.stdout.write(f"{parsed.dir}: {parsed.kind} model, digest {digest}\n")
    return 0


# `python -m pytest_sharedkv` has imported this package before pytest could mark it for
# assertion rewriting; the plugin has no asserts to rewrite, so the warning is noise.
QUIET = ["-W", "ignore:Module already imported so cannot be rewritten:"
               "pytest.PytestAssertRewriteWarning"]


def suite_args(extra: Sequence[str]) -> list[str]:
    args = ["--pyargs", "pytest_sharedkv.suites", *QUIET, *extra]
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        args = ["-p", "sharedkv", *args]
    if not any(a == "--sharedkv-json" or a.startswith("--sharedkv-json=") for a in extra):
        args += ["--sharedkv-json", DEFAULT_JSON]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        return 0
    if args and args[0] == "make-model":
        return make_model_command(args[1:])
    if args and args[0] == "run":
        args = args[1:]
    import pytest

    return int(pytest.main(suite_args(args)))


if __name__ == "__main__":
    sys.exit(main())
