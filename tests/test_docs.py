"""The docs cannot drift from the code: the options page is the generator's output, its
rows show the option table's defaults, and every relative link in README.md and docs/
names a file that exists. (docs/ is not in the sdist, MANIFEST.in says why: there these
skip.) The site's strict build (warnings as errors) is .ci/run's."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from pytest_sharedkv.config import options_doc
from pytest_sharedkv.config.options import OPTIONS, Settings, options_of, parse_bool, setting

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
OPTIONS_PAGE = ROOT / options_doc.PAGE
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.fixture
def docs() -> Path:
    if not DOCS.is_dir():
        pytest.skip("docs/ is not here (the sdist leaves it out)")
    return DOCS


@pytest.mark.usefixtures("docs")
def test_the_options_page_is_the_generators_output() -> None:
    assert OPTIONS_PAGE.read_text() == options_doc.render(), (
        "docs/options.md differs from the option table: run "
        "python -m pytest_sharedkv.config.options_doc")


@pytest.mark.usefixtures("docs")
def test_the_options_page_shows_the_defaults() -> None:
    """Each option's row gives its default as the table has it: a flag on by default reads
    'on' (the KV audit), any other flag 'off', a value its shown default."""
    rows = {m.group(1): m.group(2).strip() for m in re.finditer(
        r"^\| `(--sharedkv-[a-z0-9-]+)[^`]*` \| [^|]* \| ([^|]*) \|", OPTIONS_PAGE.read_text(),
        re.M)}
    assert set(rows) == {opt.flag_name for opt in OPTIONS}
    for opt in OPTIONS:
        if opt.flag:
            assert rows[opt.flag_name] == ("on" if opt.default else "off"), opt.flag_name
        elif opt.default is not None:
            assert rows[opt.flag_name] == opt.show(opt.default).replace("_", r"\_"), \
                opt.flag_name
    assert rows["--sharedkv-kv-audit"] == "on"


def test_an_option_added_to_the_settings_is_on_the_page() -> None:
    """Another engineer's new field needs no edit of the page's code, only a rerun."""
    @dataclasses.dataclass(frozen=True)
    class More(Settings):
        new_switch: bool = setting(True, "a new switch with <angle> and | pipes", parse_bool,
                                   flag=True)

    page = options_doc.render(options_of(More))
    assert ("| `--sharedkv-new-switch` | `sharedkv_new_switch` | on | a new switch with "
            r"\<angle\> and \| pipes |") in page.splitlines()


def test_check_says_where_the_page_differs(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "options.md"
    page.write_text(options_doc.render().replace("| 1800 |", "| 1900 |"))
    assert options_doc.main(["--check", "--page", str(page)]) == 1
    assert "differs from the option table" in capsys.readouterr().err
    assert options_doc.main(["--page", str(page)]) == 0
    assert options_doc.main(["--check", "--page", str(page)]) == 0
    assert page.read_text() == options_doc.render()


def relative_links(page: Path) -> list[str]:
    """The link targets of PAGE that point into the repository (not URLs, not anchors)."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [target for target in LINK.findall(text)
            if not re.match(r"[a-z]+:", target) and not target.startswith("#")]


def test_every_relative_link_names_a_file_that_exists(docs: Path) -> None:
    pages = [ROOT / "README.md", *sorted(docs.rglob("*.md"))]
    broken = [f"{page.relative_to(ROOT)}: {target}" for page in pages
              for target in relative_links(page)
              if not (page.parent / target.split("#", 1)[0]).exists()]
    assert broken == []
    readme = relative_links(ROOT / "README.md")
    assert {"docs/options.md", "docs/findings/2026-12-02-hosts.md"} <= set(readme)


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("[there](there.md) [web](https://example.org) [here](#top)\n"
                    "```\n[in code](nowhere.md)\n```\n")
    assert relative_links(page) == ["there.md"]
