"""Bad option or ini values are usage errors that name the option, never tracebacks."""

from __future__ import annotations

import re

import pytest

from pytest_sharedkv.config.options import (
    OPTIONS,
    OptionError,
    format_size,
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
    result.stderr.fnmatch_lines(["ERROR: --sharedkv-json: cannot write out is a directory"])


INI_TWIN = re.compile(r"^  (\w+) \(string\):\n\s+ini twin of (--[\w-]+):", re.M)


def ini_twins(help_text: str) -> dict[str, str]:
    """ini key -> the flag its help says it twins, from the ini section of ``--help``."""
    _, _, ini_section = help_text.partition("[pytest] configuration options")
    return dict(INI_TWIN.findall(ini_section))


def test_every_lasting_option_has_an_ini_twin(pytester: pytest.Pytester) -> None:
    """Read from --help's two sections: each flag is listed with the plugin's options, and
    each lasting one has an ini key (sharedkv_ and the flag's name) whose help names it."""
    out = pytester.runpytest("--help").stdout.str()
    options_section, _, _ = out.partition("[pytest] configuration options")
    for opt in OPTIONS:
        assert re.search(rf"^  {re.escape(opt.flag_name)}(=|\s|$)", options_section, re.M), \
            opt.flag_name
    twins = ini_twins(out)
    assert twins == {"sharedkv_" + flag.removeprefix("--sharedkv-").replace("-", "_"): flag
                     for flag in twins.values()}
    lasting = [opt.flag_name for opt in OPTIONS if opt.name != "list-targets"]  # one-shot
    assert sorted(twins.values()) == sorted(lasting)


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
