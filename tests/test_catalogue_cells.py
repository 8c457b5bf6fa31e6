"""The fault catalogue's judgement (service.catalogue), from a cell's data alone: which
checks caught a class, and whether that is what the class expects; the option's values and
the switches that put a hook on a launched server's path. No pair is launched here (the
stub runs are in test_catalogue_stub.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_sharedkv.engine_hooks import switches
from pytest_sharedkv.engine_hooks.fault_classes import BY_NAME, CLASSES
from pytest_sharedkv.report.records import Bundle, Check, ResultSink
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


def _recorded(*cells: Cell, nodeid: str = "t::catalogue") -> list[Check]:
    """CELLS' records as the catalogue makes them (a sink that keeps them)."""
    sink = ResultSink(nodeid, Bundle())
    recorder = catalogue.Recorder(sink, {"provider": "vllm", "allocator": "lazy"})
    for made in cells:
        recorder(made)
    return sink.bundle.checks


def test_the_catalogue_line_names_what_the_suite_cannot_see() -> None:
    cells = (cell("misrouted"), cell("lost-write", wrong=1), cell("delayed-producer", wrong=1),
             cell("l2-load-failure", not_applicable="no topology"))
    assert [c.name for c in catalogue.Catalogue(cells, 12.0).failures] == [
        "misrouted", "delayed-producer"]
    for made in cells:
        made.wall_s = 3.0
    text = catalogue.line(_recorded(*cells), "lazy", [c.name for c in cells], {"t::catalogue"})
    assert text is not None and text.startswith(
        "CATALOGUE lazy: 1 of 3 fault classes seen as expected (12 s in its cells); this suite "
        "cannot see misrouted on this stack; delayed-producer: the stack races")


def test_a_catalogue_cut_short_says_how_far_it_got_from_its_records() -> None:
    """Interrupted (its test has no outcome) or stopped (a chosen class has no record): how
    many of the chosen classes have a record and which never ran; never "not run" where
    cells ran, nor an offer of what was asked for."""
    asked = [c.name for c in CLASSES]
    ran = _recorded(cell("l2-load-failure", not_applicable="no topology"),
                    cell("misrouted", mismatches=4), cell("key-collision", mismatches=2))
    assert catalogue.line(ran, "mixed", asked, set()) == (
        "CATALOGUE mixed: interrupted after 3 of 9 classes (not run: lost-write, bit-flip, "
        "bit-flip-unread, state-unrestored, state-foreign, delayed-producer); of those, 2 of "
        "2 fault classes seen as expected (0 s in its cells)")
    stopped = catalogue.line(ran, "mixed", asked, {"t::catalogue"})  # its test failed
    assert stopped is not None and stopped.startswith(
        "CATALOGUE mixed: stopped after 3 of 9 classes (not run: lost-write,")
    every = catalogue.line(_recorded(*(cell(c.name, mismatches=1) for c in CLASSES)),
                           "mixed", asked, set())
    assert every is not None and every.startswith(
        "CATALOGUE mixed: interrupted after 9 of 9 classes; of those, ")
    assert catalogue.line([], "mixed", asked, set()) == (
        "CATALOGUE mixed: none of the 9 classes asked for has a record")
    assert catalogue.line([], "mixed", None, set()) is None
    assert catalogue.offer(ran, "vllm", "mixed", asked) == []
    assert catalogue.offer([], "vllm", "mixed", asked) == []
    rows = catalogue.matrix(ran)  # in the class table's order, not the order recorded
    assert [r.split("|")[2].strip() for r in rows[3:]] == [
        "misrouted", "key-collision", "l2-load-failure"]


class _Closing:
    """A pair whose close leaves LEFTOVERS."""

    def __init__(self, leftovers: list[int]) -> None:
        self.leftovers = leftovers

    def close(self) -> list[int]:
        return self.leftovers


def test_each_cell_is_recorded_and_handed_to_the_run_as_it_is_judged() -> None:
    """The record is made and delivered the moment its cell is judged (the sink keeps
    nothing back for the test's report); a cell judged again amends its own record."""
    delivered: list[Bundle] = []

    def deliver(bundle: Bundle) -> bool:
        delivered.append(bundle)
        return True

    sink = ResultSink("t::catalogue", Bundle(), deliver)
    recorder = catalogue.Recorder(sink, {"provider": "vllm", "allocator": "mixed"})
    first = cell("misrouted", mismatches=4)
    recorder(first)
    assert [[c.key["step"] for c in b.checks] for b in delivered] == [["misrouted"]]
    assert not sink.bundle
    second = cell("lost-write", wrong=2)
    recorder(second)
    assert [[c.key["step"] for c in b.checks] for b in delivered] == [["misrouted"],
                                                                      ["lost-write"]]
    first.why_unknown = "processes [12] survived the cell's teardown"
    recorder(first)  # judged again: no second record
    assert len(delivered) == 2 and not sink.bundle
    (amended,) = delivered[0].checks
    assert (amended.status, amended.kind) == ("unknown", "fault-catalogue")
    assert amended.detail["why_unknown"] == first.why_unknown
    assert amended.message.startswith("misrouted: UNKNOWN: processes [12] survived")
    catalogue.close_cells(_Closing([4242]), [second], recorder)  # type: ignore[arg-type]  # its pair left a process
    assert len(delivered) == 2 and delivered[1].checks[0].status == "unknown"
    catalogue.close_cells(_Closing([]), [cell("bit-flip")], recorder)  # type: ignore[arg-type]  # a clean teardown
    assert len(delivered) == 2
    kept = ResultSink("t::catalogue", Bundle())  # no one to deliver to (an xdist worker)
    catalogue.Recorder(kept, {})(cell("misrouted", mismatches=4))
    assert [c.key["step"] for c in kept.bundle.checks] == ["misrouted"]
    refused = ResultSink("t::catalogue", Bundle(), lambda bundle: False)
    catalogue.Recorder(refused, {})(cell("misrouted", mismatches=4))
    assert len(refused.bundle.checks) == 1


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
    from pytest_sharedkv.stack.launch.providers import process_env
    from pytest_sharedkv.stack.launch.spec import INJECT_DIR, LaunchSpec

    source = (INJECT_DIR / "sitecustomize.py").read_text()
    assert [s for s in switches.SWITCHES if f'os.environ.get("{s}")' not in source] == []
    spec = LaunchSpec(tmp_path, gate=False,
                      server_env=(("SHAREDKV_FAULT_CONTROL", str(tmp_path / "c.json")),))
    env = process_env(spec, base={}, role=SERVER_ROLE)
    assert env["PYTHONPATH"].split(":")[0] == str(INJECT_DIR)
    plain = LaunchSpec(tmp_path, gate=False, server_env=(("CUDA_LAUNCH_BLOCKING", "1"),))
    assert "PYTHONPATH" not in process_env(plain, base={}, role=SERVER_ROLE)
