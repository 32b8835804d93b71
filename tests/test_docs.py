"""README, --help and man pages agree: every command, option, config key, status field and metric is documented."""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

import pytest

from fusefs.cli.main import build_parser
from fusefs.daemon import schema
from fusefs.daemon.status import StatusDocument, StatusSections
from tools import genman
from tools.genman import documented_actions, tool_parsers

ROOT = Path(__file__).resolve().parent.parent


def test_generated_man_pages_are_current() -> None:
    """seerfs-control(7) included: its status fields and metrics come from the status types."""
    stale = [name for name, make in genman.PAGES.items() if (ROOT / "man" / name).read_text() != make()]
    assert not stale, f"run tools/genman: stale {stale}"


def test_readme_lists_every_metric_as_generated() -> None:
    assert (ROOT / "README.md").read_text() == genman.readme_text(), "run tools/genman: README's metric list is stale"
    readme = (ROOT / "README.md").read_text()
    page = (ROOT / "man" / "seerfs-control.7").read_text()
    for spec in schema.metric_specs(StatusDocument).values():
        assert f"`{spec.exposed}" in readme, spec.exposed
        assert f".B {genman.esc(spec.exposed)}" in page, spec.exposed


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_readme_names_every_command_and_option() -> None:
    readme = (ROOT / "README.md").read_text()
    for name, p in _subcommands().items():
        assert re.search(rf"seerfs {name}\b", readme), f"README does not show 'seerfs {name}'"
        for action in p._actions:
            for opt in action.option_strings:
                if opt in ("-h", "--help"):
                    continue
                assert opt in readme, f"README does not mention {name} {opt}"


def test_readme_names_every_tool_option() -> None:
    """Each program under tools/ has a README bullet that lists every option its --help shows (the
    generated seerfs-tools(7) page cannot drift: it is built from the same parsers)."""
    bullets = (ROOT / "README.md").read_text().split("\n- ")
    for name, p in tool_parsers().items():
        base = name.split()[0]
        text = " ".join(b for b in bullets if f"`tools/{base} " in b or f"`tools/{base}`" in b)
        assert text, f"README has no bullet for tools/{base}"
        for action in documented_actions(p):
            for opt in action.option_strings:
                if opt.startswith("--"):
                    assert opt in text, f"README does not mention tools/{name} {opt}"


def test_control_page_documents_every_status_section_and_field() -> None:
    page = (ROOT / "man" / "seerfs-control.7").read_text()
    for section in StatusSections.__annotations__:
        assert f".SS {genman.esc(section)}\n" in page, section
    for item in schema.walk(StatusDocument):
        if item.path not in StatusSections.__annotations__:  # a section is a .SS heading
            assert f".B {genman.esc(item.path)}\n" in page, item.path


OUTSIDE_CITATION = re.compile(
    r"\bDESIGN(?:\.md|\s+(?:section\s+)?\d)"  # the design notes the project started from
    r"|\b[Ii]ssues?\s*#\s*\d|\b[Ii]ssues?\s+\d"  # the tracker's issue numbers
    r"|\b[Ss]eeds?\s+0\d\d\b|\bseeds/\d"  # source papers by their number in the notes
    r"|\.\./shared|/work/share[d]"  # the notes' directory
)
"""Citations a person who clones the repository cannot follow.  Written so this file does not match
itself; cite README.md, ARCHITECTURE.md, a man page or a paper by its title instead."""
CITATIONS_ALLOWED_IN = {"CHANGELOG.md"}


def citations_in(text: str) -> list[tuple[int, str]]:
    return [(n, m.group(0)) for n, line in enumerate(text.splitlines(), 1) for m in OUTSIDE_CITATION.finditer(line)]


def test_no_tracked_file_cites_a_document_outside_the_repository() -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (an unpacked sdist): no tracked files to list")
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    found = []
    for name in names.decode().split("\0"):
        path = ROOT / name
        if not name or name in CITATIONS_ALLOWED_IN or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary (a plot)
        found += [f"{name}:{n}: {hit!r}" for n, hit in citations_in(data.decode("utf-8", errors="replace"))]
    assert not found, "cite an in-repo document (README.md, ARCHITECTURE.md, a man page) instead:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "line",
    [
        # each split inside a word, so this file does not cite anything itself
        "stall the FUSE loop (DES" + "IGN 3)",
        "ImageFolder order, DES" + "IGN section 4.1",
        "see DES" + "IGN.md",
        "targets (iss" + "ue 7)",
        "fixed in Iss" + "ue #12",
        "LRU under shuffling (se" + "ed 003)",
        "cat see" + "ds/003_paper.txt",
        ".." + "/shared/notes.md",
    ],
)
def test_the_citation_check_catches_a_citation(line: str) -> None:
    """The check above can fail: each of these lines in a tracked file is reported."""
    assert citations_in(line), line


def test_the_citation_check_lets_in_repo_references_pass() -> None:
    ok = 'NoPFS 5.1 (Dryden et al., SC\'21); README.md, "Seed discovery"; seed 0; --seed 42; 2 issues'
    assert not citations_in(ok)
