"""What a file must hold for ``compare`` and ``merge-screenings`` to judge it: a
pytest-sharedkv report (its ``schema``), and for ``pytest-sharedkv/1`` every list a verdict
is read from, as lists of objects with the fields a verdict reads. A file that lacks them
cannot say it held no failure, so it is refused naming the field, never read as clean; a
record's kind and status must be words this plugin knows (``report.records``), since a
verdict is read from nothing else."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pytest_sharedkv.report.records import Kind, Status

REPORT_SCHEMA = "pytest-sharedkv/1"  # json_report.SCHEMA, without importing the plugin
_VERSIONED = re.compile(r"pytest-sharedkv/(?P<version>\d+)")
_SHOWN_KEYS = 8

Types = tuple[type, ...]
TEXT: Types = (str,)
TEXT_OR_NULL: Types = (str, type(None))
OBJECT: Types = (dict,)


class SchemaError(Exception):
    """What the file lacks or is, naming the field."""


@dataclass(frozen=True)
class Entries:
    """A top-level list of objects: whether every report holds it, the fields each entry
    must hold and those it may hold, with their JSON types."""

    required: bool
    fields: dict[str, Types]
    optional: dict[str, Types]


# The lists a pytest-sharedkv/1 report has held since the first one (collection and facts
# came later, without a new schema) and the fields compare reads from them.
ENTRIES = {
    "tests": Entries(True, {"nodeid": TEXT, "outcome": TEXT_OR_NULL},
                     {"tier": TEXT_OR_NULL, "message": TEXT, "params": (dict, type(None))}),
    "checks": Entries(True, {"tier": TEXT},
                      {"key": OBJECT, "nodeid": TEXT, "message": TEXT, "detail": OBJECT,
                       "passed": (int,), "trials": (int,), "kind": TEXT, "status": TEXT}),
    "notes": Entries(True, {"tier": TEXT, "text": TEXT},
                     {"nodeid": TEXT, "kind": TEXT, "status": TEXT}),
    "collection": Entries(False, {"nodeid": TEXT, "outcome": TEXT}, {"message": TEXT}),
    "facts": Entries(False, {"name": TEXT}, {"value": TEXT, "nodeid": TEXT}),
}
# Top-level fields compare reads where present (older reports lack some).
TOP_LEVEL: dict[str, Types] = {
    "created": TEXT, "plugin_version": TEXT, "complete": (bool,),
    "interrupted": (str, bool, type(None)), "exitstatus": (int, type(None)),
    "environment": OBJECT, "tiers": OBJECT, "summary": OBJECT,
}
# The words a record's kind and status may be; a record with a kind carries its status.
WORDS: dict[str, type[Kind] | type[Status]] = {"kind": Kind, "status": Status}


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _words(types: Types) -> str:
    names = {dict: "an object", str: "a string", bool: "true or false", int: "an integer",
             type(None): "null", list: "a list"}
    return " or ".join(names.get(t, t.__name__) for t in types)


def _typed(where: str, value: object, types: Types) -> None:
    # JSON's true/false are no count: bool is an int to Python, not to the report
    wrong = isinstance(value, bool) and bool not in types
    if wrong or not isinstance(value, types):
        raise SchemaError(f"{where}: expected {_words(types)}, found {_type_name(value)}")


def version(data: dict[str, Any]) -> int:
    """The report schema's version; SchemaError where DATA is not a pytest-sharedkv report
    (another tool's file, or another pytest-sharedkv file such as the service corpus)."""
    if "schema" not in data:
        keys = sorted(map(str, data))
        shown = ", ".join(keys[:_SHOWN_KEYS]) + (", ..." if len(keys) > _SHOWN_KEYS else "")
        raise SchemaError("not a pytest-sharedkv report: it has no \"schema\" key (its top "
                          f"level holds {shown or 'nothing'})")
    schema = data["schema"]
    if not isinstance(schema, str):
        raise SchemaError(f"schema: expected a string, found {_type_name(schema)} (not a "
                          "pytest-sharedkv report)")
    match = _VERSIONED.fullmatch(schema)
    if match is None:
        if schema.startswith("pytest-sharedkv"):
            raise SchemaError(f"not a report: its schema {schema!r} is another pytest-sharedkv "
                              f"file's (a report's is {REPORT_SCHEMA!r})")
        raise SchemaError(f"not a pytest-sharedkv report: its schema is {schema!r}, another "
                          "tool's")
    found = int(match["version"])
    if found < 1:
        raise SchemaError(f"schema {schema!r}: no pytest-sharedkv wrote it (a report's is "
                          f"{REPORT_SCHEMA!r})")
    return found


def _entry(name: str, index: int, entry: object, spec: Entries) -> None:
    where = f"{name}[{index}]"
    _typed(where, entry, OBJECT)
    assert isinstance(entry, dict)
    for field, types in {**spec.fields, **spec.optional}.items():
        if field in entry:
            _typed(f"{where}.{field}", entry[field], types)
    for field in spec.fields:
        if field not in entry:
            raise SchemaError(f"{where}.{field}: missing (each entry of {name} holds "
                              f"{', '.join(spec.fields)})")
    if name not in ("checks", "notes") or "kind" not in entry:
        return  # a record without a kind was written before records had one: legacy
    if "status" not in entry:
        raise SchemaError(f"{where}.status: missing (a record with a kind carries its status)")
    for field, words in WORDS.items():
        value = entry[field]
        if value not in {w.value for w in words}:
            raise SchemaError(f"{where}.{field}: {value!r} is not a record {field} this plugin "
                              f"knows ({', '.join(w.value for w in words)})")


def validate(data: dict[str, Any]) -> None:
    """SchemaError naming the first field of DATA (a pytest-sharedkv/1 report) that is
    missing or not what the schema holds there."""
    for field, types in TOP_LEVEL.items():
        if field in data:
            _typed(field, data[field], types)
    for name, spec in ENTRIES.items():
        if name not in data:
            if spec.required:
                raise SchemaError(f"{name}: missing (every {REPORT_SCHEMA} report lists its "
                                  f"{', '.join(n for n, s in ENTRIES.items() if s.required)})")
            continue
        entries = data[name]
        if not isinstance(entries, list):
            raise SchemaError(f"{name} is not a list")
        for index, entry in enumerate(entries):
            _entry(name, index, entry, spec)
