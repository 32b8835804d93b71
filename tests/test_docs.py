"""README, --help and man pages agree: every command, option and config key is documented."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from fusefs.cli.main import build_parser
from tools import genman
from tools.genman import documented_actions, tool_parsers

ROOT = Path(__file__).resolve().parent.parent


def test_generated_man_pages_are_current() -> None:
    stale = [name for name, make in genman.PAGES.items() if (ROOT / "man" / name).read_text() != make()]
    assert not stale, f"run tools/genman: stale {stale}"


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


def test_control_page_documents_every_status_section() -> None:
    page = (ROOT / "man" / "seerfs-control.7").read_text()
    for section in (
        "snapshot",
        "seed",
        "discovery",
        "reads",
        "plan",
        "cursor",
        "prefetch",
        "memory_budget",
        "tiers",
        "progress",
    ):
        assert f".B {section}\n" in page, section
