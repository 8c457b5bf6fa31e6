"""Bad option or ini values are usage errors that name the option, never tracebacks."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_sharedkv.config.options import (
    ARGS,
    FLAG,
    OPTION_KEY,
    OPTIONS,
    PATH,
    Option,
    OptionError,
    Settings,
    format_size,
    options_of,
    parse_gpus,
    parse_size,
    parse_sizes,
    whole_number,
)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sharedkv-sizes=4KiB,lots"], "--sharedkv-sizes: 'lots' is not a size*"),
        (["--sharedkv-sizes=0"], "--sharedkv-sizes: '0' is not a positive*"),
        (["--sharedkv-trials=zero"], "--sharedkv-trials: 'zero' is not a whole number*"),
        (["--sharedkv-trials=0"], "--sharedkv-trials: '0' is out of range; it takes a whole "
                                  "number from 1 to 100000"),
        (["--sharedkv-delay-cycles=1.5"], "--sharedkv-delay-cycles: '1.5' is not a whole*"),
        (["--sharedkv-gpus=a,b"], "--sharedkv-gpus: 'a' is not a device*"),
        (["--sharedkv-gpus=0,0"], "--sharedkv-gpus: '0,0' names a device twice*"),
        (["--sharedkv-lease-timeout=-1"], "--sharedkv-lease-timeout: '-1' is out of range*"),
        (["--sharedkv-vllm-args=--foo 'bar"], "--sharedkv-vllm-args: \"--foo 'bar\" does not "
                                              "parse as shell-quoted arguments*"),
        (["--sharedkv-vllm-args=serve --foo"], "--sharedkv-vllm-args: 'serve --foo' starts "
                                               "with 'serve', not a flag*"),
        (["--sharedkv-perf-model=27b"], "--sharedkv-perf-model: '27b' is not one of geometry, "
                                        "27b-compute"),
        (["--sharedkv-kv-cache-gib=0"], "--sharedkv-kv-cache-gib: '0' is out of range*"),
        (["--sharedkv-perf-arms=OFF,ON"], "--sharedkv-perf-arms: 'OFF,ON' names OFF, the "
                                          "control every block pair holds anyway; it takes "
                                          "one or more of ON,HOSTS,NATIVE"),
        (["--sharedkv-perf-arms=ON,FAST"], "--sharedkv-perf-arms: FAST: not a treatment arm*"),
        (["--sharedkv-perf-arms=on,ON"], "--sharedkv-perf-arms: 'on,ON' names ON twice*"),
        (["--sharedkv-perf-arms=,"], "--sharedkv-perf-arms: needs at least one treatment arm*"),
        (["--sharedkv-service-sizes=8k,256k"], "--sharedkv-service-sizes: 256k: not among "
                                               "3k, 8k, 32k, 128k"),
        (["--sharedkv-perf-sizes=8k,512k"], "--sharedkv-perf-sizes: 512k: not among 3k, 8k, "
                                            "32k, 128k, 256k"),
        (["--sharedkv-perf-sizes=256k,256k"], "--sharedkv-perf-sizes: '256k,256k' names "
                                              "256k twice*"),
        (["--sharedkv-native-arm", "--sharedkv-perf-arms=NATIVE"],
         "--sharedkv-native-arm is shorthand for --sharedkv-perf-arms ON,NATIVE, but "
         "--sharedkv-perf-arms gives NATIVE; give one of them, or both alike"),
    ],
)
def test_bad_option_is_a_usage_error(
    pytester: pytest.Pytester, args: list[str], message: str
) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_vllm_args_parse_as_a_shell_would(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nsharedkv_vllm_args = --max-num-seqs 32 --tag 'a b'\n")
    pytester.makepyfile("""
        def test_x(sharedkv_settings):
            assert sharedkv_settings.vllm_args == ("--max-num-seqs", "32", "--tag", "a b")
    """)
    pytester.runpytest().assert_outcomes(passed=1)
    pytester.makeini("[pytest]\nsharedkv_vllm_args = --tag 'a b\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: ini option sharedkv_vllm_args: * does not parse*"])


@pytest.mark.parametrize(("ini", "args", "arms"), [
    ("", [], ("ON",)),
    ("", ["--sharedkv-perf-arms=native"], ("NATIVE",)),
    ("", ["--sharedkv-perf-arms=NATIVE,ON"], ("ON", "NATIVE")),  # block order, as written
    ("", ["--sharedkv-native-arm"], ("ON", "NATIVE")),
    ("", ["--sharedkv-native-arm", "--sharedkv-perf-arms=ON,NATIVE"], ("ON", "NATIVE")),
    ("sharedkv_perf_arms = NATIVE\nsharedkv_native_arm = false", [], ("NATIVE",)),
    ("sharedkv_native_arm = true", [], ("ON", "NATIVE")),
])
def test_the_perf_arms_and_their_shorthand(pytester: pytest.Pytester, ini: str,
                                           args: list[str], arms: tuple[str, ...]) -> None:
    """--sharedkv-perf-arms names the treatments screened against OFF; --sharedkv-native-arm
    is ON,NATIVE, and the two given alike agree."""
    from pytest_sharedkv.state import state_of

    pytester.makeini(f"[pytest]\n{ini}\n")
    settings = state_of(pytester.parseconfigure(*args)).settings
    assert settings.treatment_arms == arms


@pytest.mark.parametrize(("ini", "args", "sizes"), [
    ("", [], ("8k", "32k")),
    ("", ["--sharedkv-service-sizes=8k,32k,128k"], ("8k", "32k", "128k")),
    ("", ["--sharedkv-perf-sizes=8k,256k"], ("8k", "256k")),
    ("", ["--sharedkv-service-sizes=3k", "--sharedkv-perf-sizes=256k"], ("256k",)),
    ("sharedkv_perf_sizes = 32k,256k", ["--sharedkv-service-sizes=3k"], ("32k", "256k")),
    ("sharedkv_service_sizes = 128k", [], ("128k",)),
])
def test_the_perf_sizes_and_what_they_fall_back_to(
        pytester: pytest.Pytester, ini: str, args: list[str], sizes: tuple[str, ...]) -> None:
    """--sharedkv-perf-sizes (256k among them) where given, else --sharedkv-service-sizes
    (commands that chose the perf sizes with it run the same), else 8k,32k."""
    from pytest_sharedkv.perf.fixtures import perf_sizes
    from pytest_sharedkv.state import state_of

    pytester.makeini(f"[pytest]\n{ini}\n")
    assert perf_sizes(state_of(pytester.parseconfigure(*args)).settings) == sizes


def test_perf_arms_that_contradict_the_ini_shorthand_name_both(
        pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nsharedkv_native_arm = true\n")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--sharedkv-perf-arms=ON")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: ini option sharedkv_native_arm is shorthand for "
                                 "--sharedkv-perf-arms ON,NATIVE, but --sharedkv-perf-arms "
                                 "gives ON*"])
    assert "passed" not in result.stdout.str()


def test_bad_ini_value_names_the_ini_key(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nsharedkv_trials = many\n")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: ini option sharedkv_trials: 'many' is not a whole*"])


def test_command_line_wins_over_ini(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nsharedkv_trials = 3\nsharedkv_sizes = 8KiB\n")
    pytester.makepyfile("""
        def test_x(sharedkv_settings):
            assert sharedkv_settings.trials == 7
            assert sharedkv_settings.sizes == (8192,)
            assert sharedkv_settings.sources["trials"] == "--sharedkv-trials"
            assert sharedkv_settings.sources["sizes"] == "ini option sharedkv_sizes"
    """)
    pytester.runpytest("--sharedkv-trials=7").assert_outcomes(passed=1)


def test_json_path_that_is_a_directory(pytester: pytest.Pytester) -> None:
    pytester.mkdir("out")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--sharedkv-json=out")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --sharedkv-json: cannot write the report to "
                                 f"{pytester.path}/out: it is a directory"])


@pytest.mark.parametrize(("path", "problem"), [
    # a directory that cannot be made: root passes os.access on /proc, the write does not
    ("/proc/nosuchdir/r.json",
     "its directory /proc/nosuchdir cannot be made (No such file or directory)"),
    ("/etc/hostname/r.json", "/etc/hostname is not a directory"),
    ("{tmp}/a-file/deeper/r.json", "{tmp}/a-file is not a directory"),
])
@pytest.mark.parametrize("given", ["option", "ini"])
def test_json_path_that_cannot_be_written_is_a_usage_error(
        pytester: pytest.Pytester, path: str, problem: str, given: str) -> None:
    """One rule before any test: a path the report cannot be written to stops the run and
    names the option (or ini key) and the path; nothing falls back to the temp dir."""
    (pytester.path / "a-file").write_text("")
    path, problem = (t.replace("{tmp}", str(pytester.path)) for t in (path, problem))
    assert path.startswith("/")  # shown as given: absolute paths stay what they are
    pytester.makepyfile("def test_x(): pass")
    if given == "ini":
        pytester.makeini(f"[pytest]\nsharedkv_json = {path}\n")
        result, where = pytester.runpytest(), "ini option sharedkv_json"
    else:
        result, where = pytester.runpytest(f"--sharedkv-json={path}"), "--sharedkv-json"
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {where}: cannot write the report to {path}: "
                                 f"{problem}"])
    assert "passed" not in result.stdout.str() and "sharedkv-report-" not in result.stdout.str()


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write where permission bits say no")
def test_json_path_without_permission_is_a_usage_error(pytester: pytest.Pytester) -> None:
    locked = pytester.mkdir("locked")
    locked.chmod(0o500)
    try:
        pytester.makepyfile("def test_x(): pass")
        result = pytester.runpytest("--sharedkv-json=locked/r.json")
    finally:
        locked.chmod(0o700)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --sharedkv-json: cannot write the report to "
                                 f"{pytester.path}/locked/r.json: no file can be made in "
                                 f"{pytester.path}/locked*"])


def test_json_write_that_fails_at_the_end_falls_back_and_says_where(
        pytester: pytest.Pytester) -> None:
    """Writable when the run began, the report's directory replaced by a file meanwhile:
    the run's report is not lost, and the summary says where it went."""
    pytester.makepyfile("""
        import shutil
        from pathlib import Path

        def test_x():
            shutil.rmtree("out")
            Path("out").write_text("")
    """)
    result = pytester.runpytest("--sharedkv-json=out/r.json", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK
    line = next(t for t in result.stdout.lines if "the report is at" in t)
    assert line.startswith(f"--sharedkv-json: could not write {pytester.path}/out/r.json (")
    fallback = Path(line.rsplit(" ", 1)[1])
    try:
        assert fallback.name == f"sharedkv-report-{os.getpid()}.json"
        assert fallback.read_text().startswith("{")
    finally:
        fallback.unlink()


# a short key (sharedkv_l2) has its help on its own line, as argparse lays it out
INI_TWIN = re.compile(r"^  (\w+) \((\w+)\):\s+ini twin of (--[\w-]+):", re.M)


def ini_twins(help_text: str) -> dict[str, str]:
    """ini key -> the flag its help says it twins, from the ini section of ``--help``."""
    _, _, ini_section = help_text.partition("[pytest] configuration options")
    return {key: flag for key, _, flag in INI_TWIN.findall(ini_section)}


def ini_types(help_text: str) -> dict[str, str]:
    """ini key -> its type, as ``--help`` lists it."""
    _, _, ini_section = help_text.partition("[pytest] configuration options")
    return {key: kind for key, kind, _ in INI_TWIN.findall(ini_section)}


def test_every_lasting_option_has_an_ini_twin(pytester: pytest.Pytester) -> None:
    """Read from --help's two sections: each flag is listed with the plugin's options, and
    each lasting one has an ini key (sharedkv_ and the flag's name) whose help names it."""
    out = pytester.runpytest("--help").stdout.str()
    options_section, _, _ = out.partition("[pytest] configuration options")
    for opt in OPTIONS:
        assert re.search(rf"^  {re.escape(opt.flag_name)}(=|,|\s|$)", options_section, re.M), \
            opt.flag_name
    twins = ini_twins(out)
    assert twins == {"sharedkv_" + flag.removeprefix("--sharedkv-").replace("-", "_"): flag
                     for flag in twins.values()}
    lasting = [opt.flag_name for opt in OPTIONS if opt.name != "list-targets"]  # one-shot
    assert sorted(twins.values()) == sorted(lasting)
    fields = [f.name for f in dataclasses.fields(Settings) if f.name != "sources"]
    assert [opt.field for opt in OPTIONS] == fields  # every setting is an option


def test_ini_keys_are_typed(pytester: pytest.Pytester) -> None:
    """pytest reads each ini twin with its type: a flag's as a bool, a path's as paths
    (relative to the ini file), vLLM's flags as shell-quoted arguments."""
    types = ini_types(pytester.runpytest("--help").stdout.str())
    expected = {opt.dest: {FLAG: "bool", PATH: "paths", ARGS: "args"}.get(opt.kind, "string")
                for opt in OPTIONS if opt.ini}
    assert types == expected
    assert {types[k] for k in ("sharedkv_triage", "sharedkv_json", "sharedkv_vllm_args",
                               "sharedkv_trials")} == {"bool", "paths", "args", "string"}


LASTING_FLAGS = [opt for opt in OPTIONS if opt.flag and opt.ini]
# what a flag needs beside it to be turned off (a usage error elsewhere)
OFF_NEEDS = {"inprocess-prefix-caching": ("--sharedkv-stack=inprocess",
                                          "--sharedkv-provider=stub")}


@pytest.mark.parametrize("opt", LASTING_FLAGS, ids=[opt.name for opt in LASTING_FLAGS])
def test_the_command_line_turns_off_a_flag_the_ini_turned_on(pytester: pytest.Pytester,
                                                           opt: Option) -> None:
    from pytest_sharedkv.state import state_of

    pytester.makeini(f"[pytest]\n{opt.dest} = true\n")
    assert getattr(state_of(pytester.parseconfigure()).settings, opt.field) is True
    settings = state_of(pytester.parseconfigure(*OFF_NEEDS.get(opt.name, ()),
                                                opt.off_name)).settings
    assert getattr(settings, opt.field) is False
    assert settings.sources[opt.field] == opt.off_name
    assert state_of(pytester.parseconfigure(opt.flag_name)).settings.sources[opt.field] \
        == opt.flag_name


def test_paths_are_absolute_as_pytest_makes_them(pytester: pytest.Pytester,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """An option's path is relative to where pytest was invoked, an ini value's to the ini
    file's directory; a test that changes directory does not move the report."""
    pytester.makeini("[pytest]\nsharedkv_snapshot_dir = refs\n")
    sub = pytester.mkdir("sub")
    sub.joinpath("test_moves.py").write_text(
        "import os\n\ndef test_moves(sharedkv_settings):\n"
        "    print('SETTINGS', sharedkv_settings.json, sharedkv_settings.snapshot_dir)\n"
        "    os.chdir('/')\n")
    monkeypatch.chdir(sub)
    result = pytester.runpytest_inprocess("--sharedkv-json=r.json", "-s", "-p",
                                          "no:cacheprovider", "test_moves.py")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*SETTINGS {sub}/r.json {pytester.path}/refs"])
    assert (sub / "r.json").is_file()


@pytest.mark.parametrize(("ini", "message"), [
    ("sharedkv_triage = maybe", "ini option sharedkv_triage: its value is not a boolean "
                                "(*'maybe'*); use true or false"),
    ("sharedkv_json = a.json b.json", "ini option sharedkv_json: names 2 paths (*/a.json, "
                                      "*/b.json); it takes one"),
])
def test_a_bad_typed_ini_value_names_the_ini_key(pytester: pytest.Pytester, ini: str,
                                                 message: str) -> None:
    pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def _sections(help_text: str) -> dict[str, str]:
    """Each --sharedkv-* option's help in ``pytest --help``, whitespace folded."""
    flat = " ".join(help_text.split())
    starts = [(m.start(), m.group(1)) for m in re.finditer(r" (--sharedkv-[a-z0-9-]+)[ =,]", flat)]
    return {name: flat[at:end] for (at, name), (end, _) in
            zip(starts, [*starts[1:], (len(flat), "")], strict=True)}


def test_a_default_is_written_once(pytester: pytest.Pytester) -> None:
    """Each option's default is its Settings field's default, and the help that shows a
    default shows that value: a default written in one place only."""
    sections = _sections(pytester.runpytest("--help").stdout.str())
    defaults = Settings()
    for opt in OPTIONS:
        field = next(f for f in dataclasses.fields(Settings) if f.name == opt.field)
        assert opt.default == field.default == getattr(defaults, opt.field)
        if opt.flag:  # off by default, or on and said so, with the flag that turns it off
            assert opt.default is False or (opt.default is True and opt.ini
                                             and "on by default" in opt.help
                                             and opt.off_name in opt.help), opt.flag_name
        elif opt.default is not None:
            assert "{default}" in opt.about, f"{opt.flag_name}: its help must show the default"
            shown = f"default {opt.show(opt.default)}"
            assert shown in opt.help and shown in sections[opt.flag_name], opt.flag_name
    assert "default 1e8" in sections["--sharedkv-delay-cycles"]
    assert "default 4KiB,1MiB,16MiB" in sections["--sharedkv-sizes"]


def test_a_changed_default_shows_in_the_help_and_the_settings() -> None:
    """The tie itself: one field with another default (the option unchanged) moves both."""
    spec = next(f for f in dataclasses.fields(Settings) if f.name == "trials")

    @dataclasses.dataclass(frozen=True)
    class Changed(Settings):
        trials: int = dataclasses.field(default=3, metadata=spec.metadata)

    option = next(o for o in options_of(Changed) if o.name == "trials")
    assert Changed().trials == option.default == 3
    assert "(default 3;" in option.help
    assert "(default 10;" in next(o for o in OPTIONS if o.name == "trials").help
    assert OPTION_KEY in spec.metadata
    assert Settings(allocators=("lazy",)).allocators == ("lazy",)  # keywords, as tests use


@pytest.mark.parametrize(("ini", "args", "where", "message"), [
    ("sharedkv_gpus = 7", ["--sharedkv-gpus=7"], "{src} names device '7', which is not among",
     "*it takes indices or UUIDs of visible devices"),
    ("sharedkv_provider = stub\nsharedkv_inject_delay = 1e8",
     ["--sharedkv-provider=stub", "--sharedkv-inject-delay=1e8"],
     "{src}: the stub provider launches no process to delay", "*"),
    ("sharedkv_endpoints = http://127.0.0.1:9,http://127.0.0.1:10\nsharedkv_triage = true",
     ["--sharedkv-endpoints=http://127.0.0.1:9,http://127.0.0.1:10", "--sharedkv-triage"],
     "{src}: the triage relaunches the pair under each of its controls, and the external "
     "provider ({endpoints}) serves a deployment the suite never starts or stops", "*"),
])
@pytest.mark.parametrize("given", ["ini", "option"])
def test_an_error_names_where_the_value_came_from(
        pytester: pytest.Pytester, fake_gpus: Callable[[str], None], ini: str, args: list[str],
        where: str, message: str, given: str) -> None:
    """The same bad value from an ini file names the ini key, from the command line the
    option (--sharedkv-gpus from an ini file named the option)."""
    fake_gpus("0,1")
    pytester.makepyfile("import pytest\n@pytest.mark.sharedkv_gpu\ndef test_x(): pass\n")
    key = ini.rsplit("\n", 1)[-1].split(" = ")[0]
    if given == "ini":
        pytester.makeini(f"[pytest]\n{ini}\n")
        result, src = pytester.runpytest(), f"ini option {key}"
    else:
        result, src = pytester.runpytest(*args), "--sharedkv-" + key.removeprefix(
            "sharedkv_").replace("_", "-")
    endpoints = "ini option sharedkv_endpoints" if given == "ini" else "--sharedkv-endpoints"
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {where.format(src=src, endpoints=endpoints)}{message}"])
    assert "Traceback" not in result.stderr.str()
    assert "passed" not in result.stdout.str()


def test_parsers() -> None:
    assert parse_size("4KiB") == 4096
    assert parse_size("16MiB") == 16 << 20
    assert parse_size("1g") == 1 << 30
    assert parse_sizes("4KiB, 1MiB") == (4096, 1 << 20)
    assert format_size(16 << 20) == "16MiB"
    assert format_size(1000) == "1000B"
    assert whole_number(1, 10**11)("1e8") == 100_000_000
    assert whole_number(1, 10**11)("100_000_000") == 100_000_000
    assert parse_gpus("0,GPU-1234abcd") == ("0", "GPU-1234abcd")
    for bad in ("", "4XB", "-1", "2GiB"):
        with pytest.raises(OptionError):
            parse_size(bad)
