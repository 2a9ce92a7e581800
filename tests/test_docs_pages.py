"""The reader's pages say what is: every page of docs/ outside docs/notes/ is at most 500 lines
and holds no dated history, which goes to docs/notes/ (docs/notes/README.md).

Dated history, precisely: outside fenced code blocks, with line breaks read as spaces,

- a state that ended or began at a date: ``until``, ``till``, ``before``, ``since``, ``up to`` or
  ``as of`` followed by a date ``YYYY-MM-DD`` ("which the server had until 2026-12-05");
- a state that ended at a time of a day the page does not date: ``until that`` morning,
  afternoon, evening, night or day ("a 256-entry table until that evening");
- ``it replaced`` (what the code did before).

A date beside a figure, saying when it was measured ("x86-64-amx, 2026-12-06"), is no history.

And every link between pages lands: a relative link in README.md, docs/ or docs/notes/ names a
file that exists and, with ``#anchor``, a heading of that page (GitHub's slug of it) or an
``<a id="anchor">`` it holds, so a section moved to another page takes its links with it.
"""

from __future__ import annotations

import re
import tomllib
import warnings
from pathlib import Path

import pytest

DOCS = Path(__file__).parents[1] / "docs"
LIMIT = 500
DATE = r"20\d\d-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])"
HISTORY = re.compile(
    rf"\b(?:until|till|before|since|up\s+to|as\s+of)\s+{DATE}\b"
    r"|\buntil\s+that\s+(?:morning|afternoon|evening|night|day)\b"
    r"|\bit\s+replaced\b",
    re.IGNORECASE,
)
# Pages being trimmed by a change of their own when this test landed (issue 56: docs/backends.md,
# its AVX2 history): the test warns that they remain, and fails once one passes, so that its entry
# leaves with the change that trimmed it.
PENDING: set[str] = set()


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def history(text: str) -> list[str]:
    """Each dated-history phrase in ``text`` (a page), as ``line N: phrase``."""
    lines = text.split("\n")
    fence = False
    kept = []
    for line in lines:
        if line.lstrip().startswith("```"):
            fence = not fence
            kept.append("")
        else:
            kept.append("" if fence else line)
    prose = "\n".join(kept)
    return [f"line {prose.count(chr(10), 0, m.start()) + 1}: {' '.join(m.group(0).split())}" for m in HISTORY.finditer(prose)]


def faults(page: Path) -> list[str]:
    text = page.read_text()
    found = [f"{page.name}: {n} lines (at most {LIMIT})" for n in [text.count("\n")] if n > LIMIT]
    return found + [f"{page.name}: dated history, {h}" for h in history(text)]


@pytest.mark.parametrize("page", [p.name for p in pages()])
def test_a_readers_page_is_short_and_says_what_is(page: str) -> None:
    found = faults(DOCS / page)
    if page in PENDING:
        assert found, f"docs/{page} passes now: take it out of PENDING in {Path(__file__).name}"
        warnings.warn(f"docs/{page} is still being trimmed (PENDING): " + "; ".join(found), stacklevel=1)
        return
    assert found == [], "\n".join(found)


def test_the_check_bites_and_spares_what_is_no_history() -> None:
    assert len(pages()) >= 10 and not any(p.parent.name == "notes" for p in pages())
    caught = history(
        "the path the server had until\n2026-12-05, saved\n"
        "a table until that evening\nIt replaced fixed tasks\nSince 2026-11-30 it reads\n"
        "```\nuntil 2026-12-05 in a code block\n```\n"
    )
    assert caught == ["line 1: until 2026-12-05", "line 3: until that evening", "line 4: It replaced", "line 5: Since 2026-11-30"]
    assert history("measured on x86-64-amx, 2026-12-06, the machine shared; wait until 10-20 ms pass\n") == []


LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces as ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors a page holds: its headings' slugs (outside fenced code) and its ``<a id>``s."""
    found: set[str] = set()
    fence = False
    for line in page.read_text().split("\n"):
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found | set(re.findall(r'<a id="([^"]+)"', page.read_text()))


def broken_links(page: Path) -> list[str]:
    """Each relative link of ``page`` that names no file, or no anchor of the page it names."""
    found = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            found.append(f"{page.name}: {target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            found.append(f"{page.name}: {target}: no such heading in {linked.name}")
    return found


@pytest.mark.parametrize("page", ["README.md", *(f"docs/{p.name}" for p in pages()), *(f"docs/notes/{p.name}" for p in sorted((DOCS / "notes").glob("*.md")))])
def test_every_link_between_pages_lands(page: str) -> None:
    assert broken_links(DOCS.parent / page) == []


def test_the_link_check_bites(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# A page\n\n## `uform.index` — an index\n\n<a id=\"gpu\"></a>\n```\n# not a heading\n```\n")
    (tmp_path / "b.md").write_text(
        "[a](a.md#uformindex--an-index) [b](a.md#gpu) [c](https://x.org/y.md) "
        "[d](a.md#not-a-heading) [e](notes/a.md) [f](#plan) [g](a.md)\n"
    )
    assert broken_links(tmp_path / "b.md") == [
        "b.md: a.md#not-a-heading: no such heading in a.md",
        "b.md: notes/a.md: no such file",
        "b.md: #plan: no such heading in b.md",
    ]


def test_every_readers_page_is_in_the_readmes_documentation_list() -> None:
    """README's "Documentation" is the index of the pages: a page split off another (demo.md,
    op-library.md, media-images.md, ...) that it does not list is found only through links."""
    listed = set(re.findall(r"^- \[docs/([a-z-]+\.md)\]\(docs/\1\) — ", (DOCS.parent / "README.md").read_text().partition("\n## Documentation\n")[2], flags=re.M))
    assert sorted({p.name for p in pages()} - listed) == []


# uform on PyPI is another project (uform 3.1.3 when this test landed, without `uform serve`,
# `uform index` or these extras): `pip install 'uform[serve]'` in a fresh environment installs it.
# This uform installs from its checkout, as README.md says: `pip install -e '.[serve]'`.
EXTRAS = set(tomllib.loads((DOCS.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def install_commands(text: str) -> list[str]:
    """Each ``pip install`` a page tells its reader to run: a line of a fenced ``sh`` block (each
    command of an ``&&`` chain) or a code span that starts with it; a quoted error message is
    neither."""
    found, fence = [], None
    for line in text.split("\n"):
        if line.startswith("```"):
            fence = line[3:].strip() if fence is None else None
        elif fence == "sh":
            found += [c.strip() for c in line.split("#")[0].split("&&") if c.strip().startswith("pip install")]
    return found + re.findall(r"`(pip install [^`]*)`", text)


def wrong_installs(page: Path) -> list[str]:
    """Each install command of ``page`` that takes uform from the registry or names no extra of pyproject.toml."""
    found = []
    for command in install_commands(page.read_text()):
        if re.search(r"""(?:^|\s)["']?uform(?:\[|["']|\s|$)""", command):
            found.append(f"{page.name}: `{command}` installs PyPI's uform, another project; from the checkout: pip install -e .")
        for extras in re.findall(r"""(?:^|\s)["']?\.\[([^\]]*)\]""", command):
            found += [f"{page.name}: `{command}`: no extra {e!r} in pyproject.toml" for e in extras.split(",") if e.strip() not in EXTRAS]
    return found


@pytest.mark.parametrize("page", ["README.md", *(f"docs/{p.name}" for p in pages())])
def test_every_install_command_installs_this_checkout(page: str) -> None:
    assert wrong_installs(DOCS.parent / page) == []


def test_the_install_check_bites(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text(
        "```sh\npip install 'uform[serve]'   # the server\npip install -e '.[serve]' && pip install -U uform\n"
        "pip install torch==2.14.1 && pip install -e '.[nosuch,test]'\n```\n"
        "Install: `pip install \"uform[index]\"`, `pip install -e .`; the error says "
        "`uform: error: uform serve needs the serve extra: pip install 'uform[serve]'`.\n"
    )
    assert wrong_installs(tmp_path / "a.md") == [
        "a.md: `pip install 'uform[serve]'` installs PyPI's uform, another project; from the checkout: pip install -e .",
        "a.md: `pip install -U uform` installs PyPI's uform, another project; from the checkout: pip install -e .",
        "a.md: `pip install -e '.[nosuch,test]'`: no extra 'nosuch' in pyproject.toml",
        "a.md: `pip install \"uform[index]\"` installs PyPI's uform, another project; from the checkout: pip install -e .",
    ]
