"""docs/cli.md and docs/cli-models.md (the commands that make and measure models) name every
option of every command: each ``--option`` that ``uform COMMAND --help`` prints appears in that
command's section of its page, or in cli.md's "What every command shares" (``--model``,
``--quiet``): an option added to a parser and not to the page fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from uform.cli import main

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGE = DOCS / "cli.md"
PAGES = ("cli.md", "cli-models.md")


def sections_by_page() -> dict[str, dict[str, str]]:
    """Each ``## `uform COMMAND` `` section of each page, by page and command."""
    found: dict[str, dict[str, str]] = {}
    for page in PAGES:
        parts = re.split(r"^## `uform ([a-z-]+)`\s*$", (DOCS / page).read_text(), flags=re.M)
        found[page] = dict(zip(parts[1::2], parts[2::2]))
    return found


def sections() -> dict[str, str]:
    """Each command's section, whichever page holds it (a command on two pages fails here)."""
    pages = sections_by_page()
    twice = sorted(set(pages["cli.md"]) & set(pages["cli-models.md"]))
    assert twice == [], f"commands with a section on both pages: {twice}"
    return {command: text for page in pages.values() for command, text in page.items()}


def shared() -> str:
    """The page's "What every command shares" section."""
    return PAGE.read_text().split("## What every command shares", 1)[1].split("\n## ", 1)[0]


def options(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))


def test_the_page_has_a_section_for_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    listed = re.findall(r"^    ([a-z][a-z-]*)\b", capsys.readouterr().out, flags=re.M)  # the commands under COMMAND
    assert sorted(listed) == sorted(sections())


@pytest.mark.parametrize("command", sorted(sections()))
def test_every_option_of_a_command_is_on_its_section(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command, "--help"]) == 0
    printed = options(capsys.readouterr().out) - {"--help"}
    assert printed, f"uform {command} --help printed no options"
    assert sorted(printed - options(sections()[command]) - options(shared())) == []


def test_the_pages_table_of_commands_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    """The table at the top of docs/cli.md, the reader's index of commands, has a row for each
    command ``uform --help`` lists, linked to its section on the page that holds it (it once
    lacked convert and labels)."""
    assert main(["--help"]) == 0
    listed = re.findall(r"^    ([a-z][a-z-]*)\b", capsys.readouterr().out, flags=re.M)
    table = PAGE.read_text().split("## What every command shares", 1)[0]
    rows = re.findall(r"^\| \[`([a-z-]+)`\]\(((?:[a-z-]+\.md)?)#uform-([a-z-]+)\) \|", table, flags=re.M)
    assert sorted(listed) == sorted(name for name, _, _ in rows)
    pages = sections_by_page()
    assert [name for name, page, anchor in rows if name != anchor or name not in pages[page or "cli.md"]] == []


@pytest.mark.parametrize("command", sorted(sections()))
def test_every_option_of_a_command_says_what_it_does(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Each option ``uform COMMAND --help`` lists comes with a line of help: ``uform new --help``
    printed ``--preset {tiny,small,base}`` and ``--seed SEED`` bare (defaults tiny and 0 unsaid),
    ``plugins`` and ``calibrate`` a bare ``--json``."""
    assert main([command, "--help"]) == 0
    listing = capsys.readouterr().out.split("options:", 1)[1].splitlines()
    bare = [line.strip() for line, after in zip(listing, listing[1:] + [""])
            if re.match(r"^  -", line) and not re.search(r"\S  +\S", line.strip()) and not re.match(r"^ {8,}\S", after)]  # fmt: skip
    assert bare == []
