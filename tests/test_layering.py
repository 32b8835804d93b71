"""The package layering ARCHITECTURE.md describes, checked on the source: no import cycles, every
package imports only its own modules and lower layers, the pure parts stay pure, and placement is
deterministic (every node must compute the same plan digest).

Imports are read from the AST, function-level ones included: a lazy import still makes a cycle,
it only hides it until the function runs.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

LAYERS: list[tuple[str, ...]] = [
    ("placement",),
    ("fusefs", "fusefs.errors", "fusefs.progress", "fusefs.waiting"),
    ("fusefs.config", "fusefs.mountinfo"),
    ("fusefs.meta",),
    ("fusefs.tiers", "fusefs.planning"),
    ("fusefs.readpath",),
    ("fusefs.cluster",),
    ("fusefs.fuse",),
    ("fusefs.daemon",),
    ("fusefs.cli",),
    ("fusefs.__main__",),
]
"""Bottom to top.  A module may import modules of its own package and of lower layers only."""

PURE = ("placement", "fusefs.readpath.contract", "fusefs.readpath.policy")
"""Decisions without I/O: events in, instructions out.  No trio, pyfuse3, sockets or file I/O."""

FORBIDDEN_IN_PURE = (
    "fusefs",
    "trio",
    "pyfuse3",
    "socket",
    "subprocess",
    "shutil",
    "mpi4py",
    "io",
    "tempfile",
    "glob",
    "pathlib",
)
"""Modules a pure module must not import (fusefs: the daemon depends on placement, never back)."""
PURE_EXCEPTIONS = {
    "fusefs.readpath.contract": ("placement",),
    "fusefs.readpath.policy": ("placement", "fusefs.readpath.contract"),
}

FILE_CALLS = {"open", "print", "input"}
OS_FILE_FUNCS = {
    "open",
    "read",
    "write",
    "pread",
    "pwrite",
    "close",
    "remove",
    "unlink",
    "rename",
    "replace",
    "mkdir",
    "makedirs",
    "rmdir",
    "removedirs",
    "listdir",
    "scandir",
    "walk",
    "stat",
    "lstat",
    "fstat",
    "chmod",
    "chown",
    "truncate",
    "ftruncate",
    "fsync",
    "link",
    "symlink",
    "readlink",
    "utime",
    "access",
    "mkfifo",
    "statvfs",
}
OS_PATH_IO = {
    "exists",
    "lexists",
    "isfile",
    "isdir",
    "islink",
    "ismount",
    "getsize",
    "getmtime",
    "getatime",
    "getctime",
    "realpath",
    "samefile",
}
NP_FILE_FUNCS = {"load", "save", "savez", "savez_compressed", "fromfile", "loadtxt", "savetxt", "genfromtxt", "memmap"}
PATH_METHODS = {
    "read_text",
    "write_text",
    "read_bytes",
    "write_bytes",
    "open",
    "mkdir",
    "unlink",
    "rmdir",
    "touch",
    "iterdir",
    "glob",
    "rglob",
    "exists",
    "is_file",
    "is_dir",
    "symlink_to",
    "tofile",
}
"""pathlib methods that touch the disk, by names no pure class uses (``replace`` or ``resolve`` are
common pure method names; the ``pathlib`` import itself is forbidden instead)."""


DETERMINISTIC = ("placement",)
"""Units every node must run to the same result: no clock, no unseeded randomness, no threads."""

NONDETERMINISTIC_IMPORTS = (
    "random",
    "secrets",
    "uuid",
    "time",
    "threading",
    "_thread",
    "concurrent",
    "multiprocessing",
    "asyncio",
)
"""Modules a deterministic unit must not import: randomness, clocks, threads and executors."""
NONDETERMINISTIC_CALLS = {
    "os.urandom",
    "os.getrandom",
    "os.cpu_count",
    "os.sched_getaffinity",
    "os.times",
    "hash",
}
"""Calls that read entropy, the machine or a per-process hash seed (``hash`` of a str differs per process)."""
CLOCK_METHODS = {"now", "utcnow", "today", "fromtimestamp"}
"""``datetime.datetime.now()``, ``datetime.date.today()``...: the calendar is pure, these read the clock."""
SEEDED_NP_RANDOM = {
    "default_rng",
    "Generator",
    "RandomState",
    "SeedSequence",
    "MT19937",
    "PCG64",
    "PCG64DXSM",
    "Philox",
    "SFC64",
}
"""numpy.random's generator constructors: allowed with a seed (or, for ``Generator``, a bit generator).
Everything else in numpy.random (``rand``, ``shuffle``, ``seed``...) draws from the hidden global state."""


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    tree: ast.Module


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def load_modules(roots: tuple[str, ...] = ("fusefs", "placement")) -> dict[str, Module]:
    mods: dict[str, Module] = {}
    for root in roots:
        for path in sorted((REPO / root).rglob("*.py")):
            name = _module_name(path)
            mods[name] = Module(name, path, ast.parse(path.read_text(), str(path)))
    return mods


def imported_names(mod: Module, known: set[str]) -> Iterator[tuple[str, int]]:
    """(module imported, line) for every import in ``mod``, resolved to the most specific known module."""
    package = mod.name if mod.path.name == "__init__.py" else mod.name.rpartition(".")[0]
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield (sub if sub in known else base), node.lineno


def _top(name: str, prefixes: tuple[str, ...]) -> str | None:
    """The longest entry of ``prefixes`` that ``name`` is or lies inside."""
    best = None
    for p in prefixes:
        if (name == p or name.startswith(p + ".")) and (best is None or len(p) > len(best)):
            best = p
    return best


ALL_UNITS = tuple(u for layer in LAYERS for u in layer)


def layer_of(name: str) -> tuple[int, str]:
    unit = _top(name, ALL_UNITS)
    assert unit is not None, f"{name} is in no layer: add its package to LAYERS and ARCHITECTURE.md"
    return next(i for i, layer in enumerate(LAYERS) if unit in layer), unit


def layering_violations(mods: dict[str, Module]) -> list[str]:
    known = set(mods)
    bad = []
    for mod in mods.values():
        mine, unit = layer_of(mod.name)
        for target, line in imported_names(mod, known):
            if target not in known:
                continue
            theirs, other = layer_of(target)
            if theirs > mine or (theirs == mine and other != unit and unit != "fusefs"):
                bad.append(f"{mod.path.relative_to(REPO)}:{line}: {mod.name} ({unit}) imports {target} ({other})")
    return bad


def cycles(mods: dict[str, Module]) -> list[list[str]]:
    known = set(mods)
    graph = {m: sorted({t for t, _ in imported_names(mods[m], known) if t in known and t != m}) for m in mods}
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in graph[m]:
            if state.get(t) == 1:
                found.append([*stack[stack.index(t) :], t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return found


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value) or '?'}.{node.attr}"  # ?: a call or subscript, e.g. Path(x).open
    return None


def _imported(node: ast.AST) -> list[str]:
    """The modules an import statement names (``import a.b`` -> a.b; ``from a import b`` -> a); none
    for a relative import or any other node."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and not node.level:
        return [node.module or ""]
    return []


def purity_violations(source: str, name: str) -> list[str]:
    """Forbidden imports and file-I/O calls in one pure module's source."""
    tree = ast.parse(source)
    allowed = PURE_EXCEPTIONS.get(name, ())
    bad = []
    for node in ast.walk(tree):
        for t in _imported(node):
            if _top(t, FORBIDDEN_IN_PURE) is not None and _top(t, allowed) is None:
                bad.append(f"{name}:{getattr(node, 'lineno', 0)}: imports {t}")
        if isinstance(node, ast.Call):
            func = _dotted(node.func) or ""
            head, _, last = func.rpartition(".")
            if (
                func in FILE_CALLS
                or (head == "os" and last in OS_FILE_FUNCS)
                or (head == "os.path" and last in OS_PATH_IO)
                or (head in ("np", "numpy") and last in NP_FILE_FUNCS)
                or (head and head not in ("os", "os.path", "np", "numpy", "math", "json") and last in PATH_METHODS)
            ):
                bad.append(f"{name}:{node.lineno}: calls {func}()")
    return bad


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> the dotted name it was imported as (``np`` -> ``numpy``, ``urandom`` -> ``os.urandom``)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    out[a.asname] = a.name
                else:
                    head = a.name.partition(".")[0]
                    out[head] = head
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _unseeded(call: ast.Call) -> bool:
    """No seed given: no argument at all, or None (``default_rng(None)``, ``MT19937(seed=None)``)."""
    args = [*call.args, *(k.value for k in call.keywords)]
    return not args or (isinstance(args[0], ast.Constant) and args[0].value is None)


def determinism_violations(source: str, name: str) -> list[str]:
    """Clocks, unseeded randomness, threads and executors in one deterministic module's source."""
    tree = ast.parse(source)
    aliases = {"np": "numpy", **_aliases(tree)}  # np: also when a snippet uses it without the import
    bad = []
    for node in ast.walk(tree):
        for t in _imported(node):
            if _top(t, NONDETERMINISTIC_IMPORTS) is not None:
                bad.append(f"{name}:{getattr(node, 'lineno', 0)}: imports {t}")
        if not isinstance(node, ast.Call):
            continue
        dotted = _dotted(node.func) or ""
        first, _, rest = dotted.partition(".")
        func = ".".join(p for p in (aliases.get(first, first), rest) if p)
        head, _, last = func.rpartition(".")
        clock = last in CLOCK_METHODS and head.rpartition(".")[2] in ("datetime", "date")
        np_clock = func == "numpy.datetime64" and any(
            isinstance(a, ast.Constant) and a.value in ("now", "today") for a in node.args
        )
        np_random = head == "numpy.random" and (last not in SEEDED_NP_RANDOM or _unseeded(node))
        if func in NONDETERMINISTIC_CALLS or clock or np_clock or np_random:
            bad.append(f"{name}:{node.lineno}: calls {dotted}()")
    return bad


def unit_violations(unit: str, check: Callable[[str, str], list[str]], *, may_be_missing: bool = False) -> list[str]:
    """``check(source, module name)`` over every module of ``unit`` (a package or a module)."""
    mods = [m for m in load_modules().values() if _top(m.name, (unit,))]
    assert mods or may_be_missing, f"no module {unit}"
    return [v for m in mods for v in check(m.path.read_text(), m.name)]


def test_no_import_cycles_in_fusefs_or_placement() -> None:
    found = cycles(load_modules())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_packages_import_only_their_own_modules_and_lower_layers() -> None:
    bad = layering_violations(load_modules())
    assert not bad, "layering violations (see ARCHITECTURE.md):\n" + "\n".join(bad)


@pytest.mark.parametrize("unit", PURE)
def test_pure_parts_import_no_io_and_call_no_file_io(unit: str) -> None:
    bad = unit_violations(unit, purity_violations, may_be_missing=unit.startswith("fusefs.readpath."))
    assert not bad, "pure modules doing I/O:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "line",
    [
        "import trio",
        "from fusefs.readpath.fetcher import Fetcher",
        "import pyfuse3",
        "import shutil",
        "open('x')",
        "np.save('x', a)",
        "numpy.load('x')",
        "os.replace('a', 'b')",
        "os.path.exists('a')",
        "Path('a').write_text('x')",
        "self.dir.mkdir()",
    ],
)
def test_the_purity_check_catches_a_forbidden_line(line: str) -> None:
    """The checks above can fail: each of these lines, added to a pure module, is reported."""
    for unit in PURE:
        assert purity_violations(line, unit), f"{line!r} in {unit} was not caught"


@pytest.mark.parametrize("unit", DETERMINISTIC)
def test_deterministic_parts_read_no_clock_no_unseeded_randomness_and_start_no_threads(unit: str) -> None:
    bad = unit_violations(unit, determinism_violations)
    assert not bad, "nondeterminism in placement (threads: take a placement.parallel.Pool):\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "line",
    [
        "import random",
        "from random import shuffle",
        "import time",
        "from time import monotonic",
        "import threading",
        "from concurrent.futures import ThreadPoolExecutor",
        "import multiprocessing",
        "import uuid",
        "os.urandom(8)",
        "from os import urandom\nurandom(8)",
        "os.cpu_count()",
        "hash('x')",
        "datetime.datetime.now()",
        "datetime.date.today()",
        "from datetime import datetime\ndatetime.now()",
        "np.datetime64('now')",
        "np.random.default_rng()",
        "np.random.default_rng(None)",
        "numpy.random.default_rng(seed=None)",
        "import numpy.random as npr\nnpr.default_rng()",
        "from numpy.random import default_rng\ndefault_rng()",
        "np.random.MT19937()",
        "np.random.RandomState()",
        "np.random.rand(3)",
        "np.random.shuffle(a)",
        "np.random.permutation(10)",
        "np.random.seed(0)",
        "np.random.randint(0, 9)",
    ],
)
def test_the_determinism_check_catches_a_forbidden_line(line: str) -> None:
    """The check above can fail: each of these lines, added to a placement module, is reported."""
    assert determinism_violations(line, "placement.plan"), f"{line!r} was not caught"


@pytest.mark.parametrize(
    "line",
    [
        "np.random.default_rng(3)",
        "np.random.MT19937(0)",
        "np.random.RandomState(seed32)",
        "np.random.Generator(bits)",
        "np.random.SeedSequence(entropy=7)",
        "np.arange('1970-01-01', '2000-01-01', dtype='datetime64[D]')",
        "os.path.normpath(p)",
        "math.lgamma(3)",
    ],
)
def test_the_determinism_check_lets_seeded_and_pure_lines_through(line: str) -> None:
    """Seeded generators (randperm's MT19937) and pure date arithmetic stay allowed."""
    assert not determinism_violations(line, "placement.plan"), f"{line!r} was reported"


def test_the_layering_check_catches_an_upward_import_and_a_cycle(tmp_path: Path) -> None:
    mods = load_modules()
    meta = mods["fusefs.meta.snapshot"]
    upward = ast.parse("from fusefs.readpath.fetcher import Fetcher")
    mods["fusefs.meta.snapshot"] = Module(meta.name, meta.path, ast.Module([*meta.tree.body, *upward.body], []))
    assert any("fusefs.meta.snapshot" in v and "fusefs.readpath.fetcher" in v for v in layering_violations(mods))
    assert any("fusefs.meta.snapshot" in c and "fusefs.readpath.fetcher" in c for c in cycles(mods))


BINDINGS = {"pyfuse3": "fusefs.fuse.pyfuse3_front", "fusefs.fuse._native": "fusefs.fuse.native_front"}
"""Each FUSE binding and the only module of the daemon that may import it: everything else names the
binding-free seam (``fusefs.fuse.front``), so fronts plug in side by side (ARCHITECTURE.md)."""


def binding_imports(mod: Module, known: set[str], binding: str = "pyfuse3") -> list[str]:
    """Where ``mod`` imports ``binding``: import statements (function-level too, ``from fusefs.fuse
    import _native`` as well) and ``importlib.import_module``/``__import__`` of a constant name."""
    known = known | {binding}  # a C extension is no .py module: resolve ``from pkg import ext`` to it
    bad = [
        f"{mod.path.relative_to(REPO)}:{line}: {mod.name} imports {target}"
        for target, line in imported_names(mod, known)
        if target == binding or target.startswith(binding + ".")
    ]
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Call) and (_dotted(node.func) or "").rpartition(".")[2] in (
            "import_module",
            "__import__",
        ):
            arg = node.args[0] if node.args else None
            name = arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else ""
            if name == binding or name.startswith(binding + "."):
                bad.append(f"{mod.path.relative_to(REPO)}:{node.lineno}: {mod.name} imports {name}")
    return bad


@pytest.mark.parametrize("binding", sorted(BINDINGS))
def test_only_its_front_imports_each_binding(binding: str) -> None:
    mods = load_modules(("fusefs",))
    front = BINDINGS[binding]
    assert front in mods, f"no module {front}"
    assert binding_imports(mods[front], set(mods), binding), f"the front no longer imports {binding}?"
    bad = [v for name, m in mods.items() if name != front for v in binding_imports(m, set(mods), binding)]
    assert not bad, f"{binding} imported outside its front (use fusefs.fuse.front):\n" + "\n".join(bad)


@pytest.mark.parametrize(
    ("binding", "line"),
    [
        ("pyfuse3", "import pyfuse3"),
        ("pyfuse3", "from pyfuse3 import FUSEError"),
        ("pyfuse3", "import pyfuse3.asyncio"),
        ("pyfuse3", "def f():\n    import pyfuse3"),
        ("pyfuse3", "importlib.import_module('pyfuse3')"),
        ("pyfuse3", "__import__('pyfuse3')"),
        ("fusefs.fuse._native", "from fusefs.fuse import _native"),
        ("fusefs.fuse._native", "import fusefs.fuse._native"),
        ("fusefs.fuse._native", "from fusefs.fuse._native import drain"),
        ("fusefs.fuse._native", "from . import _native"),
        ("fusefs.fuse._native", "importlib.import_module('fusefs.fuse._native')"),
    ],
)
def test_the_binding_check_catches_a_planted_import(binding: str, line: str) -> None:
    """The check above can fail: each line, planted in the handlers, is reported there."""
    mods = load_modules(("fusefs",))
    ops = mods["fusefs.fuse.operations"]
    assert not binding_imports(ops, set(mods), binding)
    planted = Module(ops.name, ops.path, ast.Module([*ops.tree.body, *ast.parse(line).body], []))
    assert [v for v in binding_imports(planted, set(mods), binding) if "fusefs.fuse.operations" in v]


# ---------------------------------------------------------------------------- explicit wiring

LATE_BOUND = {
    "PolicyPort.bind_executor": "fusefs.daemon.assembly",
}
"""The late-bound links (ARCHITECTURE.md, "Wiring"): the one ``bind_*`` method of each true cycle,
and the one module that calls it.  The budget, staging, the fetcher and the peers' clients exist
before the policy's executor that they report to (and that drives them), so they get the policy's
port, to which the assembly binds the executor.  The peer group's fetch is no link of its own: the
fetcher asks peers through that port, and the serving half is built after the read path."""

WIRING_ALLOWED: dict[tuple[str, str], str] = {
    ("placement.frameworks", "model.shifted"): (
        "a sampler model (a record) gets, from the factory that made it, the same factory for its "
        "shifted variant: data about a sampler, no component wired into another"
    ),
}
"""(module, ``receiver.attr``) assignments that look like wiring and are not, with the reason.  Every
component or callable is otherwise handed over in a constructor, in ``ReadPathHooks`` or in a bind
method; plain data set on a record (a fetch's result, a peer's view, a status field) is not flagged."""


RECORD_BASES = {"TypedDict", "NamedTuple", "Protocol", "Exception", "enum.Enum", "enum.Flag", "Enum", "Flag"}


def _is_record(cls: ast.ClassDef) -> bool:
    """A class holding data (a dataclass, TypedDict, enum, exception...) or a Protocol: not a component."""
    decorators = {_dotted(d.func if isinstance(d, ast.Call) else d) for d in cls.decorator_list}
    bases = {_dotted(b) for b in cls.bases}
    return (
        "dataclass" in decorators
        or bool(bases & RECORD_BASES)
        or any((b or "").endswith(("Error", "Exception", "Status")) for b in bases)
    )


def _project_names(mods: dict[str, Module]) -> tuple[set[str], set[str]]:
    """(method names, component class names folded to lowercase without underscores) of the
    components of ``fusefs``: its classes that are no record (dataclass, TypedDict, enum, Protocol,
    exception).  Properties are data to their readers, so they are left out."""
    methods: set[str] = set()
    classes: set[str] = set()
    for mod in mods.values():
        if not mod.name.startswith("fusefs"):
            continue
        for cls in ast.walk(mod.tree):
            if not isinstance(cls, ast.ClassDef) or _is_record(cls):
                continue
            classes.add(cls.name.lower())
            for fn in cls.body:
                if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and not any(
                    _dotted(d) in ("property", "functools.cached_property", "cached_property")
                    for d in fn.decorator_list
                ):
                    methods.add(fn.name)
    return methods - {"__init__", "__call__"}, classes


def _hands_over_behaviour(value: ast.expr, methods: set[str], classes: set[str]) -> bool:
    """Whether ``value`` is a component or a callable: a lambda, a ``partial``, a bound method of a
    component (``staging.read_back``, ``self._reclaim``: an attribute, not called, named like a
    component's method), or a name for a component (``revalidator`` for ``Revalidator``,
    ``self.staging`` for ``Staging``)."""
    if isinstance(value, ast.Lambda):
        return True
    if isinstance(value, ast.Call):
        return _dotted(value.func) in ("partial", "functools.partial")
    if isinstance(value, ast.Attribute) and value.attr in methods:
        return True
    if isinstance(value, ast.Name | ast.Attribute):
        last = value.id if isinstance(value, ast.Name) else value.attr
        return last.replace("_", "").lower() in classes
    return False


def wiring_violations(mod: Module, methods: set[str], classes: set[str]) -> list[str]:
    """Every ``X.attr = value`` where ``X`` is not ``self`` itself (another name, ``self.a``, a
    subscript) and ``value`` hands over a component or a callable, outside ``WIRING_ALLOWED``."""
    out = []
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
        if len(flat) == 1:
            values: list[ast.expr | None] = [value]
        elif isinstance(value, ast.Tuple) and len(value.elts) == len(flat):
            values = list(value.elts)
        else:
            values = [None] * len(flat)  # unpacked from one value: its parts are not in the source
        for target, val in zip(flat, values, strict=True):
            if not isinstance(target, ast.Attribute):
                continue
            if isinstance(target.value, ast.Name) and target.value.id == "self":
                continue  # a component's own state
            where = f"{ast.unparse(target.value)}.{target.attr}"
            if val is None or (mod.name, where) in WIRING_ALLOWED or not _hands_over_behaviour(val, methods, classes):
                continue
            out.append(f"{mod.path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
    return out


OBSERVER_LISTS = ("listeners", "hooks", "on_changed")
"""How the names of observer lists end: registering into one after construction is wiring too."""

REGISTERING = {"append", "extend", "add", "insert"}


def _observer_list(node: ast.expr) -> bool:
    """``X.<name>`` with ``<name>`` an observer list's and ``X`` another object than ``self``."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr.endswith(OBSERVER_LISTS)
        and not (isinstance(node.value, ast.Name) and node.value.id == "self")
    )


def registration_violations(mod: Module) -> list[str]:
    """Every observer registered on another object after it was built: ``X.<name>.append(...)``
    (``extend``, ``add``, ``insert``) or ``X.<name> += ...`` where ``<name>`` ends like
    ``OBSERVER_LISTS`` and ``X`` is not ``self`` (a component's own list is its own state)."""
    out = []
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in REGISTERING:
            hit = _observer_list(node.func.value)
        elif isinstance(node, ast.AugAssign):
            hit = _observer_list(node.target)
        else:
            continue
        if hit:
            out.append(f"{mod.path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
    return out


def bind_calls(mod: Module) -> Iterator[tuple[str, int]]:
    """(method name, line) of every call of a ``bind_*`` method in ``mod``."""
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr.startswith("bind_"):
            yield node.func.attr, node.lineno


def test_components_are_wired_in_constructors_not_by_assignment() -> None:
    """No component or callable is assigned onto another object: a missed assignment used to show
    up as None at run time.  Constructors take what a component needs; optional observers come in
    one ``ReadPathHooks``; the true cycles bind once through ``LATE_BOUND``'s methods."""
    mods = load_modules()
    methods, classes = _project_names(mods)
    bad = [v for m in mods.values() for v in wiring_violations(m, methods, classes)]
    assert not bad, "wiring by assignment (pass it to the constructor or ReadPathHooks):\n" + "\n".join(bad)


def test_observers_are_given_at_construction_not_registered_later() -> None:
    """No observer is appended to another object's listener or hook list after it was built: each is
    a constructor argument, a ``ReadPathHooks`` field, a report through the policy's port, or one of
    the seed's listeners given when the seed is made (ARCHITECTURE.md, "Wiring")."""
    bad = [v for m in load_modules().values() for v in registration_violations(m)]
    assert not bad, "an observer registered after construction (pass it to the constructor):\n" + "\n".join(bad)


def test_late_bound_links_are_the_documented_ones_bound_in_one_place() -> None:
    """Every ``bind_*`` method is one of ``LATE_BOUND``, ARCHITECTURE.md names it, and only its one
    module calls it."""
    mods = load_modules()
    defined = {
        f"{cls.name}.{fn.name}"
        for m in mods.values()
        for cls in ast.walk(m.tree)
        if isinstance(cls, ast.ClassDef)
        for fn in cls.body
        if isinstance(fn, ast.FunctionDef) and fn.name.startswith("bind_")
    }
    assert defined == set(LATE_BOUND), f"bind methods {sorted(defined)} differ from LATE_BOUND"
    assert len(LATE_BOUND) <= 1, f"the daemon's wiring has at most one late-bound link, not {sorted(LATE_BOUND)}"
    architecture = (REPO / "ARCHITECTURE.md").read_text()
    assert [b for b in LATE_BOUND if f"`{b}`" not in architecture] == [], "ARCHITECTURE.md must name each"
    bad = [
        f"{m.path.relative_to(REPO)}:{line}: {method}"
        for m in mods.values()
        for method, line in bind_calls(m)
        if m.name not in {module for qual, module in LATE_BOUND.items() if qual.endswith(f".{method}")}
    ]
    assert not bad, "a bind method called outside its one place:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "line",
    [
        "fetcher.page_read = staging.read_back",
        "fetcher.revalidator = revalidator",
        "self.prefetcher.open_hook = self.discovery.on_open",
        "self.prefetcher.seed_trusted = lambda: True",
        "self.clients[key].on_state = partial(self._health, key)",
        "budget.reclaim = self._reclaim",
        "kernel.report, kernel.x = (self.report, 1)",
    ],
)
def test_the_wiring_check_catches_a_planted_assignment(line: str) -> None:
    """The check above can fail: each line, planted in the assembly, is reported."""
    mods = load_modules()
    methods, classes = _project_names(mods)
    asm = mods["fusefs.daemon.assembly"]
    assert not wiring_violations(asm, methods, classes)
    planted = Module(asm.name, asm.path, ast.Module([*asm.tree.body, *ast.parse(line).body], []))
    assert wiring_violations(planted, methods, classes), f"{line!r} was not caught"


@pytest.mark.parametrize(
    "line", ["job.data = data", "view.node = note.node", "self.board.state = 'serving'", "c.ok += 1"]
)
def test_the_wiring_check_lets_data_through(line: str) -> None:
    """Plain data set on a record (a fetch's result, a peer's view, a status field) is no wiring."""
    mods = load_modules()
    methods, classes = _project_names(mods)
    asm = mods["fusefs.daemon.assembly"]
    planted = Module(asm.name, asm.path, ast.Module([*asm.tree.body, *ast.parse(line).body], []))
    assert not wiring_violations(planted, methods, classes)


@pytest.mark.parametrize(
    "line",
    [
        "tier.drop_listeners.append(functools.partial(prefetcher.copy_lost, tier=t))",
        "self.seed.listeners.append(self._seed_written)",
        "self.revalidator.on_changed.append(self._source_changed)",
        "prefetcher.view_change_hooks.extend([self._wake])",
        "seed.listeners += (self._seed_changed,)",
        "self.plans.listeners.insert(0, self.prefetcher.on_plan)",
        "peer.seen_hooks.add(self.wake)",
    ],
)
def test_the_registration_check_catches_a_planted_line(line: str) -> None:
    """The check above can fail: each line, planted in the assembly, is reported."""
    asm = load_modules()["fusefs.daemon.assembly"]
    assert not registration_violations(asm)
    planted = Module(asm.name, asm.path, ast.Module([*asm.tree.body, *ast.parse(line).body], []))
    assert registration_violations(planted), f"{line!r} was not caught"


@pytest.mark.parametrize(
    "line", ["self.listeners.append(f)", "self.hooks += (f,)", "self.opens.append(entry)", "seen.add(key)"]
)
def test_the_registration_check_lets_own_lists_and_data_through(line: str) -> None:
    """A component's own list (``self.listeners``) and lists that hold data are not registration."""
    asm = load_modules()["fusefs.daemon.assembly"]
    planted = Module(asm.name, asm.path, ast.Module([*asm.tree.body, *ast.parse(line).body], []))
    assert not registration_violations(planted)
