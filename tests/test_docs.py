"""README, --help, the man pages and ARCHITECTURE.md agree with the code.

Every command, option, config key, status field and metric is in ``--help``, in a man page, and in
README or a page it links; README stays a front page; every function ARCHITECTURE.md's
walkthroughs name exists; no tracked file cites a document outside the repository.
"""

from __future__ import annotations

import argparse
import ast
import functools
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fusefs.cli.main import build_parser
from fusefs.daemon import schema
from fusefs.daemon.status import StatusDocument, StatusSections
from tools import genman
from tools.genman import documented_actions, tool_parsers

ROOT = Path(__file__).resolve().parent.parent
README_LIMIT = 15 * 1024
"""README.md is the front page: what seerfs is, how a job uses it, the commands, links to the rest."""
MAN_PAGES = ("seerfs.1", "seerfs.yaml.5", "seerfs-control.7", "seerfs-tools.7")
DEVELOPER_DOCS = ("ARCHITECTURE.md", "CONCURRENCY.md", "PERSISTED.md", "READPATH.md", "CONTRIBUTING.md")


def _read(name: str) -> str:
    return (ROOT / name).read_text()


def _page_section(page: str, heading: str) -> str:
    """The text of ``.SH``/``.SS`` ``heading`` up to the next heading of the same kind."""
    kind = heading.split()[0]
    start = page.index(heading + "\n")
    end = page.find("\n" + kind + " ", start + len(heading))
    return page[start : end if end >= 0 else len(page)]


def test_generated_man_pages_are_current() -> None:
    """seerfs-control(7) included: its status fields and metrics come from the status types."""
    stale = [name for name, make in genman.PAGES.items() if (ROOT / "man" / name).read_text() != make()]
    assert not stale, f"run tools/genman: stale {stale}"


def test_control_page_lists_every_metric() -> None:
    page = _read("man/seerfs-control.7")
    metrics = _page_section(page, ".SH METRICS")
    for spec in schema.metric_specs(StatusDocument).values():
        assert f".B {genman.esc(spec.exposed)}" in metrics, spec.exposed


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _readme_command_rows() -> list[str]:
    """The first cell of each row of README's command table."""
    section = _read("README.md").split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    return [row.split("|")[1].strip() for row in section.splitlines() if row.startswith("| `seerfs ")]


def test_readme_command_table_names_every_subcommand() -> None:
    rows = _readme_command_rows()
    named = {m.group(1) for row in rows if (m := re.match(r"`seerfs ([a-z]+)\b", row))}
    missing = set(_subcommands()) - named
    assert not missing, f"README's command table has no row for {sorted(missing)}"
    unknown = named - set(_subcommands()) - {"SOURCE"}
    assert not unknown, f"README's command table names no such command: {sorted(unknown)}"


def test_seerfs_page_documents_every_command_and_option() -> None:
    page = _read("man/seerfs.1")
    for name, p in _subcommands().items():
        section = _page_section(page, f".SS {genman.esc(name)}")
        for action in documented_actions(p):
            for opt in action.option_strings:
                assert genman.esc(opt) in section, f"seerfs(1) does not document {name} {opt}"


def test_tools_page_documents_every_tool_option() -> None:
    """Each program under tools/ has a section of seerfs-tools(7) naming every option its --help shows."""
    page = _read("man/seerfs-tools.7")
    for name, p in tool_parsers().items():
        section = _page_section(page, ".SH " + genman.esc("tools/" + name))
        for action in documented_actions(p):
            for opt in action.option_strings:
                assert f".B {genman.esc(opt)}" in section, f"seerfs-tools(7) does not document tools/{name} {opt}"


def test_readme_is_a_front_page_that_links_every_man_page() -> None:
    readme = _read("README.md")
    assert len(readme.encode()) <= README_LIMIT, f"README.md is {len(readme.encode())} bytes (at most {README_LIMIT})"
    for page in MAN_PAGES:
        assert f"](man/{page})" in readme, f"README does not link man/{page}"
    for note in DEVELOPER_DOCS:
        assert f"]({note})" in readme, f"README does not link {note}"


def test_every_relative_link_in_the_docs_resolves() -> None:
    """README's and the developer notes' links lead to files of the repository (where the facts moved)."""
    broken = []
    for name in ("README.md", "tests/README.md", *DEVELOPER_DOCS):
        base = (ROOT / name).parent
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", _read(name)):
            if not (base / target).exists():
                broken.append(f"{name}: {target}")
    assert not broken, broken


def test_readme_recipe_is_the_man_page_example() -> None:
    """README's "How a job uses it" block is seerfs(1)'s EXAMPLES job, line for line."""
    section = _read("README.md").split("## How a job uses it", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None
    assert block.group(1).strip("\n").splitlines() == genman.JOB_EXAMPLE.strip("\n").splitlines()


def test_control_page_documents_every_status_section_and_field() -> None:
    page = _read("man/seerfs-control.7")
    for section in StatusSections.__annotations__:
        assert f".SS {genman.esc(section)}\n" in page, section
    for item in schema.walk(StatusDocument):
        if item.path not in StatusSections.__annotations__:  # a section is a .SS heading
            assert f".B {genman.esc(item.path)}\n" in page, item.path


def test_architecture_has_no_wall_of_a_table_cell() -> None:
    """A map reads in one pass: a table cell of more than a few lines belongs in a developer note."""
    long = [
        f"{n}: {len(cell)} characters"
        for n, line in enumerate(_read("ARCHITECTURE.md").splitlines(), 1)
        if line.startswith("|")
        for cell in line.strip("|").split(" | ")
        if len(cell) > 400
    ]
    assert not long, long


# ------------------------------------------------------------------ the walkthroughs name real code

MODULE_PATH = re.compile(r"`((?:fusefs|placement|tools)/[\w/]+\.py)`")
DOTTED_NAME = re.compile(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)`")


@dataclass
class Walkthrough:
    title: str
    steps: list[str] = field(default_factory=list)
    trailer: str = ""


def walkthroughs(text: str) -> list[Walkthrough]:
    """The ``## N. Walkthrough ...`` sections: their numbered steps, and the text after the last."""
    out: list[Walkthrough] = []
    for part in re.split(r"^## ", text, flags=re.M)[1:]:
        title, _, body = part.partition("\n")
        if not re.match(r"\d+\. Walkthrough", title):
            continue
        walk = Walkthrough(title)
        in_steps = False
        for line in body.splitlines():
            if re.match(r"\d+\. ", line):
                walk.steps.append(line)
                in_steps = True
            elif in_steps and line.startswith("   ") and walk.steps:
                walk.steps[-1] += "\n" + line
            elif line.strip() or not in_steps:
                in_steps = in_steps and not line.strip()
                if walk.steps:
                    walk.trailer += line + "\n"
        out.append(walk)
    return out


@functools.cache
def _module(path: str) -> ast.Module | None:
    file = ROOT / path
    return ast.parse(file.read_text()) if file.is_file() else None


def _target_names(target: ast.expr) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Tuple):
        return [n for elt in target.elts for n in _target_names(elt)]
    return []


def _self_attrs(target: ast.expr) -> list[str]:
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
        return [target.attr]
    if isinstance(target, ast.Tuple):
        return [n for elt in target.elts for n in _self_attrs(elt)]
    return []


def _members(node: ast.Module | ast.ClassDef) -> dict[str, ast.AST]:
    """What a module or class body defines (functions, classes, assignments), and for a class also
    every ``self.X`` its methods assign: the names a walkthrough may write as ``Class.X``."""
    out: dict[str, ast.AST] = {}
    for st in node.body:
        if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out[st.name] = st
        elif isinstance(st, ast.Assign):
            out |= {n: st for t in st.targets for n in _target_names(t)}
        elif isinstance(st, ast.AnnAssign):
            out |= {n: st for n in _target_names(st.target)}
    if isinstance(node, ast.ClassDef):
        for sub in ast.walk(node):
            if isinstance(sub, ast.Assign):
                targets = sub.targets
            elif isinstance(sub, ast.AnnAssign):
                targets = [sub.target]
            else:
                continue
            for t in targets:
                for n in _self_attrs(t):
                    out.setdefault(n, sub)
    return out


def resolves(name: str, modules: list[str]) -> bool:
    """Whether ``module.function``, ``Class.method`` or ``Class.attribute`` (any depth) is defined
    in one of ``modules`` (repository paths): ``module`` is a module's file name without ``.py``.
    Imported names do not count: a name resolves only where it is defined."""
    first, *rest = name.split(".")
    for path in modules:
        tree = _module(path)
        if tree is None:
            continue
        node: ast.AST | None = tree if Path(path).stem == first else _members(tree).get(first)
        for part in rest:
            if not isinstance(node, ast.Module | ast.ClassDef):
                node = None
                break
            node = _members(node).get(part)
        if node is not None:
            return True
    return False


def unresolved(walk: Walkthrough) -> list[str]:
    """Every problem of one walkthrough: a module path that is no file, a dotted name defined in no
    module named so far, a step that names no function at all."""
    problems: list[str] = []
    modules: list[str] = []
    for n, text in [*enumerate(walk.steps, 1), (0, walk.trailer)]:
        for path in MODULE_PATH.findall(text):
            if _module(path) is None:
                problems.append(f"step {n}: no module {path}")
            elif path not in modules:
                modules.append(path)
        names = DOTTED_NAME.findall(text)
        problems += [
            f"step {n}: {name} is defined in none of {modules}" for name in names if not resolves(name, modules)
        ]
        if n and not names:
            problems.append(f"step {n} names no function")
    return problems


def test_architecture_has_the_two_walkthroughs() -> None:
    walks = walkthroughs(_read("ARCHITECTURE.md"))
    assert [w.title.split(":")[0].split(". ", 1)[1] for w in walks] == ["Walkthrough 1", "Walkthrough 2"]
    for w in walks:
        assert len(w.steps) >= 8, f"{w.title}: {len(w.steps)} steps"
    assert "`Stage`" in walks[1].steps[-2] + walks[1].steps[-1], "walkthrough 2 ends at the first Stage instruction"


def test_every_function_a_walkthrough_names_exists() -> None:
    """Renaming or removing a function a walkthrough names fails here until the walkthrough follows."""
    problems = [f"{w.title}: {p}" for w in walkthroughs(_read("ARCHITECTURE.md")) for p in unresolved(w)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("step", "problem"),
    [
        ("1. `Fetcher.no_such_method` (`fusefs/readpath/fetcher.py`)", "Fetcher.no_such_method"),
        ("1. `OpenFiles.open` before its module is named", "OpenFiles.open"),
        ("1. `fetcher.no_such_function` (`fusefs/readpath/fetcher.py`)", "fetcher.no_such_function"),
        ("1. `Fetcher.start.deeper` (`fusefs/readpath/fetcher.py`)", "Fetcher.start.deeper"),
        ("1. `Fetcher.start` (`fusefs/readpath/no_such_module.py`)", "no module"),
        ("1. the fetcher starts (`fusefs/readpath/fetcher.py`)", "names no function"),
    ],
)
def test_the_walkthrough_check_catches_a_wrong_name(step: str, problem: str) -> None:
    """The check above can fail: each of these steps is reported."""
    (walk,) = walkthroughs(f"## 4. Walkthrough 1: test\n\n{step}\n")
    assert any(problem in p for p in unresolved(walk)), unresolved(walk)


def test_the_walkthrough_check_accepts_real_names() -> None:
    text = (
        "## 4. Walkthrough 1: test\n\n"
        "1. `Fetcher.start` (`fusefs/readpath/fetcher.py`), `fetcher.RECENT_SECONDS`, `Fetcher.inflight`,\n"
        "   `Inflight.wait`, `ControlFiles.uid` (`fusefs/fuse/control.py`), `SeedState.listeners`\n"
        "   (`fusefs/planning/seed.py`)\n"
    )
    (walk,) = walkthroughs(text)
    assert unresolved(walk) == []


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
