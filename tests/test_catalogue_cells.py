"""The fault catalogue's judgement (service.catalogue), from a cell's data alone: which
checks caught a class, and whether that is what the class expects; the option's values and
the switches that put a hook on a launched server's path. No pair is launched here (the
stub runs are in test_catalogue_stub.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_sharedkv.engine_hooks import switches
from pytest_sharedkv.engine_hooks.fault_classes import BY_NAME, CLASSES
from pytest_sharedkv.report.records import Check
from pytest_sharedkv.service import catalogue
from pytest_sharedkv.service.catalogue import Cell


def cell(name: str, wrong: int = 0, mismatches: int | None = 0, hits: bool = False,
         **extra: object) -> Cell:
    made = Cell(BY_NAME[name], requests=8, exact=8 - wrong, applications=5, faulted=4,
                mismatches=mismatches, compared=100, **extra)  # type: ignore[arg-type]
    if hits:
        made.hit_problems.append("3k-001: 12 of 3008 shareable tokens cached")
    return made


@pytest.mark.parametrize(("made", "status", "words"), [
    (cell("misrouted", mismatches=4), "pass", "misrouted: caught by audit (5 applications "
     "in 4 requests; 0 of 8 answers wrong, 4 mismatching digests"),
    (cell("misrouted"), "fail", "this suite cannot see misrouted on this stack (5 "
     "applications in 4 requests; 0 of 8 answers wrong, 0 mismatching digests"),
    (cell("misrouted", audit_on=False), "fail",
     "this suite cannot see misrouted on this stack (5 applications in 4 requests; 0 of 8 "
     "answers wrong, audit off, hits as expected)"),
    (cell("misrouted", mismatches=None), "unknown", "misrouted: UNKNOWN: caught by nothing "
     "it could read"),
    (cell("lost-write", wrong=2, mismatches=0), "pass", "lost-write: caught by answers"),
    (cell("lost-write", hits=True), "pass", "lost-write: caught by hits"),
    (cell("bit-flip-unread"), "pass", "bit-flip-unread: caught by nothing, as expected"),
    (cell("bit-flip-unread", mismatches=3), "fail", "bit-flip-unread: caught by audit, where "
     "nothing should catch it"),
    (cell("delayed-producer"), "pass", "delayed-producer: no race shows"),
    (cell("delayed-producer", wrong=1), "fail", "delayed-producer: the stack races: with a "
     "delayed producer before every KV transfer, caught by answers"),
    (cell("state-foreign", wrong=3, mismatches=3, void="VOID: state-foreign was never "
          "applied: no transfer it acts on was selected"), "void",
     "state-foreign: VOID: state-foreign was never applied"),
    (cell("l2-load-failure", not_applicable="it needs the two-host topology"), "info",
     "l2-load-failure: n/a: it needs the two-host topology"),
    (cell("key-collision", why_unknown="its pair did not start: boom"), "unknown",
     "key-collision: UNKNOWN: its pair did not start: boom"),
], ids=lambda v: v if isinstance(v, str) and " " not in v else None)
def test_each_cell_is_judged_from_its_counts(made: Cell, status: str, words: str) -> None:
    assert made.status == status
    assert made.verdict().startswith(words), made.verdict()


def test_detections_read_each_check_apart() -> None:
    assert cell("misrouted", wrong=1, mismatches=2, hits=True).detections() == {
        "answers": "caught", "audit": "caught", "hits": "caught"}
    errors = Cell(BY_NAME["misrouted"], requests=4, errors=4, mismatches=None,
                  hits_unknown="counters could not be read", audit_on=False)
    assert errors.detections() == {"answers": "unknown", "audit": "off", "hits": "unknown"}


def test_the_catalogue_line_names_what_the_suite_cannot_see() -> None:
    found = catalogue.Catalogue((cell("misrouted"), cell("lost-write", wrong=1),
                                 cell("delayed-producer", wrong=1),
                                 cell("l2-load-failure", not_applicable="no topology")), 12.0)
    assert [c.name for c in found.failures] == ["misrouted", "delayed-producer"]
    text = catalogue.line({"provider": "vllm", "allocator": "lazy"}, found)
    assert text.startswith("CATALOGUE lazy: 1 of 3 fault classes seen as expected (12 s); "
                           "this suite cannot see misrouted on this stack; delayed-producer: "
                           "the stack races")


def _record(name: str, status: str, applications: int = 3) -> Check:
    return Check("service_regression", {"provider": "vllm", "allocator": "mixed",
                                        "delay": "0", "size": "catalogue", "step": name},
                 8, 8, kind="fault-catalogue", status=status,
                 detail={"applications": applications, "expected": ["audit"],
                         "detections": {"answers": "missed", "audit": "caught",
                                        "hits": "missed"}, "wall_s": 3.0})


def test_the_summary_shows_the_matrix_and_offers_it_only_where_it_did_not_run() -> None:
    rows = catalogue.matrix([_record("misrouted", "pass"), _record("lost-write", "fail"),
                             _record("l2-load-failure", "info", 0)])
    assert rows[3].split("|")[1:-1] == [" mixed     ", " misrouted       ", " 3       ",
                                        " missed  ", " caught ", " missed ", " seen     ",
                                        " 3.0    "]
    assert "NOT SEEN" in rows[4]
    assert rows[5].split("|")[3:7] == [" -       ", " -       ", " -      ", " -      "]
    assert catalogue.offer([], "vllm", "mixed")[0].startswith(
        "CATALOGUE mixed: not run; --sharedkv-fault-catalogue all relaunches this pair")
    assert catalogue.offer([_record("misrouted", "pass")], "vllm", "mixed") == []
    assert catalogue.offer([], "external", "unknown") == []


def test_an_option_value_names_classes_the_table_has() -> None:
    assert catalogue.chosen(["all"]) == CLASSES
    assert [c.name for c in catalogue.chosen(["lost-write", "misrouted"])] == [
        "misrouted", "lost-write"]  # the table's order
    with pytest.raises(catalogue.CatalogueError, match=r"^misroute: no fault class; it takes "
                       r"all or some of misrouted, key-collision"):
        catalogue.chosen(["misroute"])


@pytest.mark.parametrize(("value", "message"), [
    ("misroute", "--sharedkv-fault-catalogue: misroute: no fault class; it takes all or"),
    ("all,misrouted", "--sharedkv-fault-catalogue: 'all,misrouted' names all and classes"),
    ("misrouted,misrouted", "--sharedkv-fault-catalogue: 'misrouted,misrouted' names "
     "misrouted twice"),
])
def test_a_bad_class_list_is_a_usage_error_naming_the_option(
        pytester: pytest.Pytester, value: str, message: str) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_inprocess(f"--sharedkv-fault-catalogue={value}",
                                          "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}*"])
    assert "Traceback" not in result.stderr.str()


def test_the_catalogue_with_external_endpoints_is_a_usage_error(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_inprocess(
        "--sharedkv-fault-catalogue=all", "--sharedkv-endpoints=http://a:1,http://b:2",
        "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--sharedkv-fault-catalogue: the fault catalogue relaunches "
                                 "the pair with each fault, and the external provider*"])


def test_the_options_help_names_every_class() -> None:
    from pytest_sharedkv.config.options import OPTIONS

    (option,) = [o for o in OPTIONS if o.name == "fault-catalogue"]
    assert [c.name for c in CLASSES if c.name not in option.help] == []


def test_every_switch_arms_a_hook_in_sitecustomize_and_puts_it_on_the_path(
        tmp_path: Path) -> None:
    """A control set through the server's environment alone (a gate-less relaunch) still
    gets the hooks on the server's path, or its hook never loads and the cell is VOID."""
    from pytest_sharedkv.engine_hooks.delay_hook import SERVER_ROLE
    from pytest_sharedkv.stack.providers import INJECT_DIR, LaunchSpec, process_env

    source = (INJECT_DIR / "sitecustomize.py").read_text()
    assert [s for s in switches.SWITCHES if f'os.environ.get("{s}")' not in source] == []
    spec = LaunchSpec(tmp_path, gate=False,
                      server_env=(("SHAREDKV_FAULT_CONTROL", str(tmp_path / "c.json")),))
    env = process_env(spec, base={}, role=SERVER_ROLE)
    assert env["PYTHONPATH"].split(":")[0] == str(INJECT_DIR)
    plain = LaunchSpec(tmp_path, gate=False, server_env=(("CUDA_LAUNCH_BLOCKING", "1"),))
    assert "PYTHONPATH" not in process_env(plain, base={}, role=SERVER_ROLE)
