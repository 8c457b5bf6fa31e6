"""``python -m pytest_sharedkv``: run the regression suite on whatever hardware is here.

``python -m pytest_sharedkv [run] [PYTEST ARGS...]`` runs the shipped suite
(``pytest --pyargs pytest_sharedkv.suites``) and writes ``sharedkv-report.json`` unless
``--sharedkv-json`` is given. Tiers that need hardware this machine lacks skip with the
reason; the rest run for real. ``python -m pytest_sharedkv compare BEFORE.json AFTER.json``
compares two such reports (before and after an upgrade): correctness first, then speed.
``python -m pytest_sharedkv merge-screenings OUT.json IN.json ...`` merges the perf
screenings of separate runs into one.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pytest is imported only for a run: make-model and compare need none
    import pytest

DEFAULT_JSON = "sharedkv-report.json"
PROG = "python -m pytest_sharedkv"  # what users type, and what pytest's usage errors name
USAGE = """usage: python -m pytest_sharedkv [run] [PYTEST ARGS...]
       python -m pytest_sharedkv make-model [--kind copy|tiny|geometry|27b-compute|
                                            copy-attention|copy-memory] DIR
                                            [--seed N] [--force]
       python -m pytest_sharedkv compare BEFORE.json AFTER.json [--max-regression 10%]
                                         [--markdown OUT.md] [--force] [--allow-flag-change]
                                         [--allow-placement-change]
                                         [--allow-topology-change] [--allow-stack-change]
       python -m pytest_sharedkv merge-screenings OUT.json IN1.json IN2.json ... [--force]

  run (default)   run the regression suite (pytest --pyargs pytest_sharedkv.suites);
                  extra arguments go to pytest, e.g. -m ordering, -n 2, --sharedkv-require-gpu;
                  writes sharedkv-report.json unless --sharedkv-json PATH is given (a run
                  of no sharedkv test writes beside a report of one that did, never over
                  it); a first word close to a subcommand's name that is no path is a
                  usage error (exit 2)
  make-model      write a model to DIR, offline, deterministic from the seed; prints its
                  digest. --kind copy (default): the KV-sensitive copy model the service
                  tier serves; --kind tiny: the random-weight tiny hybrid model;
                  --kind geometry: random weights with the KV geometry of the field
                  study's 27B hybrid model (65,536 KV bytes a token, ~0.76 GB), which the
                  perf tier serves; --kind 27b-compute: that geometry at the 27B's
                  compute (hidden 5120, a 17,408-wide FFN), no weight file: vLLM
                  serves it with random weights (--load-format dummy, fp8 where the
                  GPU has it); --kind copy-attention: the copy model's rule with
                  attention layers only (a Qwen3), for stacks that refuse a hybrid
                  model (--sharedkv-stack inprocess); --kind copy-memory: the copy
                  model's rule with a Gated DeltaNet memory of the prompt's first
                  word that never forgets, so a zeroed, foreign or rewritten
                  recurrent state resumed anywhere after it answers <miss>. A DIR
                  holding another kind (or other files) is refused unless --force,
                  which replaces what is there
  compare         compare two JSON reports (before and after an upgrade): correctness
                  first (failed tests, VOID, leaks, divergence), then median TTFT and
                  session wall time per cell (not judged where the engine flags differ:
                  FLAGS DIFFER, unless --allow-flag-change; nor where one screening ran
                  both replicas on one GPU and the other one per GPU: PLACEMENT DIFFERS,
                  unless --allow-placement-change; nor where the topology or its L2
                  differs: TOPOLOGY DIFFERS, unless --allow-topology-change; nor
                  where the KV stack differs, MP server, in-process or native
                  offload: STACK CHANGE, unless --allow-stack-change);
                  --markdown OUT.md writes it there too
                  (an existing OUT.md is replaced only with --force); exit 0 same,
                  1 regression or correctness difference, 2 usage error or reports that
                  do not compare
  merge-screenings  one perf screening from blocks measured in separate runs (a
                  screening resumed later or on another host): refused, naming the file
                  and field, unless model, corpus, engine, engine flags, arms order and
                  sizes agree; block pairs are numbered on and perf.runs says which came
                  from which run. exit 0 written, 2 usage error or inputs that do not merge
"""


def kinds_of() -> tuple[str, ...]:
    from pytest_sharedkv.models.kinds import KINDS

    return KINDS


def make_model_command(args: Sequence[str]) -> int:
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="python -m pytest_sharedkv make-model")
    parser.add_argument("dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kind", choices=kinds_of(), default="copy")
    parser.add_argument("--force", action="store_true",
                        help="replace whatever DIR holds (another kind's files included)")
    parsed = parser.parse_args(list(args))
    from pytest_sharedkv.models import kinds

    problem = kinds.refusal(parsed.dir, parsed.kind)
    if problem is not None and not parsed.force:
        parser.error(problem)
    try:
        if problem is not None:
            kinds.clear(parsed.dir)
        if parsed.kind == "copy":
            from pytest_sharedkv.models.copy_model import CopyModelRecipe, make_copy_model

            digest = make_copy_model(parsed.dir, CopyModelRecipe(seed=parsed.seed)).digest
        elif parsed.kind == "copy-attention":  # for stacks that refuse a hybrid model
            from pytest_sharedkv.models.copy_attention_model import (
                AttentionCopyRecipe,
                make_attention_copy_model,
            )

            digest = make_attention_copy_model(parsed.dir, AttentionCopyRecipe(
                seed=parsed.seed)).digest
        elif parsed.kind == "copy-memory":  # a wrong recurrent state shows far from the source
            from pytest_sharedkv.models.copy_memory_model import (
                MemoryCopyRecipe,
                make_memory_copy_model,
            )

            digest = make_memory_copy_model(parsed.dir, MemoryCopyRecipe(seed=parsed.seed)
                                            ).digest
        elif parsed.kind == "27b-compute":
            from pytest_sharedkv.models.compute_model import make_compute_model

            digest = make_compute_model(parsed.dir).digest
        elif parsed.kind == "geometry":
            from pytest_sharedkv.models.geometry_model import (
                GeometryModelRecipe,
                make_geometry_model,
            )

            digest = make_geometry_model(parsed.dir, GeometryModelRecipe(seed=parsed.seed)
                                         ).digest
        else:
            from pytest_sharedkv.models.tiny_model import TinyModelRecipe, make_model

            digest = make_model(parsed.dir, TinyModelRecipe(seed=parsed.seed)).digest
    except ImportError as exc:
        sys.stderr.write(f"make-model needs transformers and tokenizers: {exc}\n")
        return 2
    except OSError as exc:
        sys.stderr.write(f"make-model: cannot write {parsed.dir}: {exc}\n")
        return 2
    from pytest_sharedkv.cli.output import OutputError, to_stdout

    try:
        to_stdout(f"{parsed.dir}: {parsed.kind} model, digest {digest}\n")
    except OutputError as exc:  # the model is written; its digest could not be shown
        return usage_error(f"make-model: {parsed.dir} written, but {exc}")
    return 0


# `python -m pytest_sharedkv` has imported this package before pytest could mark it for
# assertion rewriting; the plugin has no asserts to rewrite, so the warning is noise.
QUIET = ["-W", "ignore:Module already imported so cannot be rewritten:"
               "pytest.PytestAssertRewriteWarning"]


def _plugin_choices(args: Sequence[str]) -> list[str]:
    """The values of every ``-p NAME`` / ``-pNAME`` in ARGS and in PYTEST_ADDOPTS."""
    import shlex

    tokens = [*shlex.split(os.environ.get("PYTEST_ADDOPTS", "")), *args]
    values = []
    for i, token in enumerate(tokens):
        if token == "-p" and i + 1 < len(tokens):
            values.append(tokens[i + 1])
        elif token.startswith("-p") and len(token) > 2 and not token.startswith("--"):
            values.append(token[2:])
    return values


DISABLED = {"no:sharedkv", "no:pytest_sharedkv", "no:pytest_sharedkv.plugin"}
XDIST_OPTIONS = ("-n", "--numprocesses", "--dist", "-d", "--tx", "--maxprocesses")


def _wants_xdist(args: Sequence[str]) -> bool:
    return any(a in XDIST_OPTIONS or a.startswith(("-n", "--numprocesses=", "--dist=", "--tx="))
               for a in args if not a.startswith("--no"))


def suite_location() -> list[str]:
    """The installed suite (``--pyargs pytest_sharedkv.suites``), or, run from a source
    checkout that is not installed (the package imports from the working directory, where
    the suite is plain ``suites/``), that folder."""
    import importlib.util
    from pathlib import Path

    if importlib.util.find_spec("pytest_sharedkv.suites") is None:
        checkout = Path(__file__).resolve().parent.parent / "suites"
        if checkout.is_dir():  # no entry point either: load the plugin by name
            return ["-p", "pytest_sharedkv", str(checkout)]
    return ["--pyargs", "pytest_sharedkv.suites"]


def suite_args(extra: Sequence[str]) -> list[str]:
    """pytest's arguments for the shipped suite: what the user gave, plus only what that run
    needs (the plugin and xdist where auto-loading is off, a JSON report where the plugin
    is on and the user named none)."""
    plugins = _plugin_choices(extra)
    enabled = not DISABLED.intersection(plugins)
    args = [*suite_location(), *QUIET, *extra]
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        load = []
        if enabled:
            load += ["-p", "sharedkv"]
        if _wants_xdist(extra) and not {"xdist", "xdist.plugin"}.intersection(plugins):
            load += ["-p", "xdist.plugin"]
        args = [*load, *args]
    if enabled and not any(a == "--sharedkv-json" or a.startswith("--sharedkv-json=")
                           for a in extra):
        args += ["--sharedkv-json", DEFAULT_JSON]
    return args


class ProgName:
    """A plugin for this wrapper's ``pytest.main`` calls: pytest names its program
    ``pytest.main()`` there (``pytest.main(): error: unrecognized arguments``), not what
    the user typed."""

    @staticmethod
    def pytest_addoption(parser: pytest.Parser) -> None:
        parser.prog = PROG


def help_command() -> int:
    """The wrapper's usage, then pytest's help with the sharedkv options (the same plugins
    a run would load)."""
    from pytest_sharedkv.cli.output import OutputError, to_stdout

    try:
        to_stdout(USAGE + "\npytest's options (python -m pytest_sharedkv takes them all):\n\n")
    except OutputError as exc:
        return usage_error(str(exc))
    import pytest

    args = ["-p", "sharedkv"] if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD") else []
    return int(pytest.main([*args, "--help"], plugins=[ProgName()]))


def main(argv: Sequence[str] | None = None) -> int:
    if sys.stdout is None:  # started with stdout closed (>&-): every subcommand prints
        from pytest_sharedkv.cli.output import STDOUT_CLOSED

        return usage_error(STDOUT_CLOSED)
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:
        return reader_gone()


def usage_error(message: str) -> int:
    """MESSAGE as one line on stderr (where there is one); exit status 2, as every
    subcommand's usage error (never 1: compare's regression)."""
    if sys.stderr is not None:
        sys.stderr.write(f"{PROG}: {message}\n")
    return 2


def reader_gone() -> int:
    """stdout's reader went away (``| head``): what is left to print goes to /dev/null
    instead of a traceback, and the exit status is a SIGPIPE's, as a shell reports for a
    tool whose pipe closed. A run that writes a report has already ended on its own (the
    plugin's closed-stdout guard) and returns pytest's status."""
    import signal

    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
    return 128 + signal.SIGPIPE


SUBCOMMANDS = ("run", "make-model", "compare", "merge-screenings", "help")


def mistyped_subcommand(first: str) -> str | None:
    """The usage error for a first argument that is a subcommand mistyped (``comapre``),
    or None. pytest would take it for a test path and fail with its own usage error
    (and, with the default report, write a report of nothing); a word is taken for a
    subcommand only where it is no option, no existing path (nor a node id or
    ``--pyargs`` module under one: its part before ``::`` or ``.`` exists) and close to a
    subcommand's name (difflib, ratio 0.7 and up), so every test path a pytest user would
    type still runs."""
    import difflib
    from pathlib import Path

    if first.startswith("-") or first in SUBCOMMANDS:
        return None
    path = first.split("::", 1)[0]
    if Path(path).exists() or Path(path.split(".", 1)[0]).exists():
        return None
    close = difflib.get_close_matches(first.lower(), SUBCOMMANDS, n=1, cutoff=0.7)
    if not close:
        return None
    return (f"{first!r} is no subcommand (did you mean {close[0]!r}?); the subcommands are "
            f"{', '.join(SUBCOMMANDS)}, and a test path must exist")


def _main(args: list[str]) -> int:
    mistyped = mistyped_subcommand(args[0]) if args else None
    if mistyped is not None:
        return usage_error(mistyped)
    if args and args[0] in ("-h", "--help", "help"):
        return help_command()
    if args and args[0] == "make-model":
        return make_model_command(args[1:])
    if args and args[0] == "compare":
        from pytest_sharedkv.cli.compare.main import main as compare_main

        return compare_main(args[1:])
    if args and args[0] == "merge-screenings":
        from pytest_sharedkv.cli.merge import main as merge_main

        return merge_main(args[1:])
    if args and args[0] == "run":
        args = args[1:]
    import pytest

    return int(pytest.main(suite_args(args), plugins=[ProgName()]))


if __name__ == "__main__":
    sys.exit(main())
