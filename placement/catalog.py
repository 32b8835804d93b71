"""The dataset catalog: file index -> (path, size, entry, label) in the order the training code indexes.

A sampler yields *indices*; the plan is only right if index i here is the very file the training
code's dataset returns for i.  So the catalog reproduces torchvision 0.28's ImageFolder listing
(``torchvision/datasets/folder.py``) exactly, from the snapshot's arrays, without touching a
filesystem:

* classes: sorted ``str`` names of the root's entries that are directories or links to them;
* per class: ``sorted(os.walk(class_dir, followlinks=True))`` (so the walk order is the sorted
  *full dirpath strings*: ``cls/sub-dir`` before ``cls/sub/deeper``), then ``sorted(fnames)``,
  keeping names whose lower-cased form ends with an extension;
* names are bytes in the snapshot but ImageFolder sorts ``str`` decoded with surrogateescape, which
  differs from bytes order only when a name is not valid UTF-8; those directories are re-sorted.

Two other layouts: ``files`` (every non-directory under the root, following the same walk, sorted
by relative path ``str``; optional extension filter) and ``list`` (an explicit list of relative
paths, given as strings: the caller reads list_file, placement does no I/O).

``timm_folder`` reproduces timm 1.0's ``find_images_and_targets`` with its reader's defaults
(``timm/data/readers/reader_image_folder.py``): every directory under the root, the root included,
is walked; a file is kept when ``os.path.splitext(name)[1].lower()`` is one of the extensions
(default ``.png .jpg .jpeg``); its class is the *name* of the directory it sits in ('' at the root,
so ``train/cat`` and ``val/cat`` are one class); classes and then all samples are sorted by
``natural_key`` (lower-cased, split into digit runs compared as ints) of the class name and of the
path.  The paths timm sorts all start with the same root and a ``/``, so sorting relative paths
gives the same order.  Where two keys tie (``img1``/``img01``, ``A``/``a``) timm's order comes from
``os.scandir`` or set iteration, which the snapshot does not record: ties are broken by ``str`` and
``exact`` turns False.

Symlinks: links to directories inside the tree are walked (a file reached through one appears
under the link's path and its ``entry`` is the resolved target's, so two indices may share an
entry).  Dangling file links are listed, as os.walk lists them.  A link leaving the tree
(LINK_OUTSIDE) cannot be planned: its target is unknown.  When its name passes the extension
filter it is kept as an unreadable placeholder, so every later index stays aligned with
ImageFolder in the common case of a file link; every such link is counted in ``outside_links``,
and ``exact`` turns False when one of them could be a directory ImageFolder would walk into.
"""

from __future__ import annotations

import itertools
import posixpath
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from placement.tree import KIND_DIR, KIND_FILE, KIND_SYMLINK, LINK_OUTSIDE, TreeArrays

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
TIMM_EXTENSIONS = (".png", ".jpg", ".jpeg")
LAYOUTS = ("imagefolder", "files", "list", "timm_folder")
DEFAULT_LAYOUT = "imagefolder"
"""What a dataset whose config gives no layout is planned as, until seed discovery finds its order."""

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]


def decode(name: bytes) -> str:
    """A name as Python's os functions give it on Linux (UTF-8, surrogateescape)."""
    return name.decode("utf-8", "surrogateescape")


def encode(name: str) -> bytes:
    return name.encode("utf-8", "surrogateescape")


@dataclass(frozen=True, eq=False)
class Catalog:
    """One dataset's files in the training code's index order (columns; see the module docstring).

    ``entry[i]`` is the TreeArrays index the daemon serves for file i (its inode is entry + 1):
    the resolved target for a symlink, the listed entry itself when it cannot be resolved.
    ``readable[i]`` is True for regular files inside the tree: the only ones that can be fetched
    and cached.  ``label[i]`` is the class index (ImageFolder's or timm's; -1 for other layouts).
    """

    root: str
    layout: str
    entry: I32
    size: I64
    label: I32
    readable: Bools
    name_entry: I32  # the entry as listed in its directory (the link itself for a symlink)
    dir_id: I32  # index into ``dirs``: the directory the file was listed in, as walked
    dirs: tuple[str, ...]  # relative to the dataset root ("" for the root itself)
    classes: tuple[str, ...]
    outside_links: tuple[str, ...]
    exact: bool

    def __len__(self) -> int:
        return int(self.entry.shape[0])

    @property
    def total_bytes(self) -> int:
        return int(self.size[self.readable].sum())

    def path(self, i: int, tree: TreeArrays) -> str:
        """Relative path of file ``i`` under the dataset root, as ImageFolder joins it.

        Base names are not copied out of the tree (a Python string per file would cost more than
        all the columns together); the directory part is kept because links make it ambiguous.
        """
        name = decode(tree.name(int(self.name_entry[i])))
        d = self.dirs[int(self.dir_id[i])]
        return f"{d}/{name}" if d else name

    def paths(self, tree: TreeArrays) -> Iterator[str]:
        for i in range(len(self)):
            yield self.path(i, tree)

    def arrays(self) -> dict[str, npt.NDArray[Any]]:
        return {
            "entry": self.entry,
            "size": self.size,
            "label": self.label,
            "readable": self.readable,
            "name_entry": self.name_entry,
            "dir_id": self.dir_id,
        }

    def meta(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "layout": self.layout,
            "dirs": [encode(d).hex() for d in self.dirs],
            "classes": [encode(c).hex() for c in self.classes],
            "outside_links": [encode(p).hex() for p in self.outside_links],
            "exact": self.exact,
        }

    @classmethod
    def from_parts(cls, meta: Mapping[str, Any], arrays: Mapping[str, npt.NDArray[Any]]) -> Catalog:
        """Inverse of :meth:`meta` + :meth:`arrays` (names travel as hex: any bytes survive JSON)."""

        def strs(key: str) -> tuple[str, ...]:
            return tuple(decode(bytes.fromhex(h)) for h in meta[key])

        return cls(
            root=meta["root"],
            layout=meta["layout"],
            entry=arrays["entry"],
            size=arrays["size"],
            label=arrays["label"],
            readable=arrays["readable"],
            name_entry=arrays["name_entry"],
            dir_id=arrays["dir_id"],
            dirs=strs("dirs"),
            classes=strs("classes"),
            outside_links=strs("outside_links"),
            exact=bool(meta["exact"]),
        )

    def digest(self) -> str:
        """xxh3-128 over everything that identifies the catalog (order, entries, sizes, labels)."""
        h = xxhash.xxh3_128()
        h.update(repr(sorted(self.meta().items())).encode())
        for key, arr in sorted(self.arrays().items()):
            h.update(key.encode())
            h.update(np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False).tobytes())
        return h.hexdigest()


# --------------------------------------------------------------------------- tree-wide columns


_ENTRY_CHUNK = 1 << 16  # entries whose extensions are matched at once (arrays that stay in cache)
_NAME_CHUNK = 1 << 24  # name bytes looked at at once: a bool per byte of 14M names would be 300 MB


def _nonascii(names: npt.NDArray[np.uint8], start: I64, length: I64) -> Bools:
    """Per entry, whether its name has a byte >= 0x80, in memory O(entries + chunk), not a running
    count per name byte (2.3 GB at 14 million names); chunks without such bytes cost one compare."""
    out = np.zeros(start.shape[0], np.bool_)
    end = start + length
    for lo in range(0, names.shape[0], _NAME_CHUNK):
        high = np.flatnonzero(names[lo : lo + _NAME_CHUNK] >= 0x80)
        if high.size:
            high += lo
            out |= np.searchsorted(high, end) > np.searchsorted(high, start)
    return out


class _TreeView:
    """Vectorised per-entry facts the listings need, computed once per tree."""

    def __init__(self, tree: TreeArrays) -> None:
        self.tree = tree
        kind = tree.kind
        n = len(tree)
        self.resolved = np.arange(n, dtype=np.int64)
        links = kind == KIND_SYMLINK
        self.resolved[links] = tree.link_target[links]
        ok = self.resolved >= 0
        rkind = np.full(n, 255, np.uint8)
        rkind[ok] = kind[self.resolved[ok]]
        self.dirlike = rkind == KIND_DIR
        self.readable = rkind == KIND_FILE
        self.outside = links & (tree.link_target == LINK_OUTSIDE)
        start = tree.name_off.astype(np.int64)
        length = tree.name_len.astype(np.int64)
        self.nonascii = _nonascii(tree.names, start, length)
        self._start = start
        self._len = length

    def name(self, i: int) -> bytes:
        return self.tree.name(i)

    def ext_match(self, extensions: tuple[str, ...] | None) -> Bools:
        """``name.lower().endswith(extensions)`` for every entry; None keeps everything."""
        n = len(self.tree)
        if extensions is None:
            return np.ones(n, np.bool_)
        short = tuple(e for e in extensions if e.isascii() and len(e) <= 8)
        out = np.zeros(n, np.bool_)
        if short:
            # last (up to) 8 name bytes, ASCII-lower-cased, packed with the final byte lowest; only as
            # many bytes as the longest extension, a slice of entries at a time (cache-sized arrays)
            names = self.tree.names
            longest = max(len(e.encode()) for e in short)
            codes = []
            for e in short:
                code = 0
                for k, ch in enumerate(reversed(e.encode())):
                    code |= ch << (8 * k)
                mask = np.uint64((1 << (8 * len(e))) - 1) if len(e) < 8 else np.uint64(2**64 - 1)
                codes.append((len(e), mask, np.uint64(code)))
            for lo in range(0, n, _ENTRY_CHUNK):
                length = self._len[lo : lo + _ENTRY_CHUNK]
                end = self._start[lo : lo + _ENTRY_CHUNK] + length
                end -= 1
                packed = np.zeros(length.shape[0], np.uint64)
                for k in range(min(longest, int(length.max()) if length.size else 0)):
                    raw = names.take(np.maximum(end - k, 0)).astype(np.uint64)
                    raw += ((raw >= 65) & (raw <= 90)).astype(np.uint64) << np.uint64(5)
                    raw[length <= k] = 0
                    packed |= raw << np.uint64(8 * k)
                part = out[lo : lo + _ENTRY_CHUNK]
                for size, mask, bits in codes:
                    part |= (length >= size) & ((packed & mask) == bits)
        # exact str semantics where ASCII shortcuts do not apply
        slow = self.nonascii if len(short) == len(extensions) else np.ones(n, np.bool_)
        for i in np.flatnonzero(slow).tolist():
            out[i] = decode(self.name(i)).lower().endswith(extensions)
        return out

    def str_sorted(self, entries: I64) -> I64:
        """``entries`` (in bytes order, one directory) re-ordered by their ``str`` names.

        UTF-8 preserves code point order, so only names that are not valid UTF-8 (decoded to
        surrogates) can move; directories without such names are returned unchanged.
        """
        odd = self.nonascii[entries]
        if not odd.any():
            return entries
        for i in entries[odd].tolist():
            try:
                self.name(i).decode("utf-8")
            except UnicodeDecodeError:
                break
        else:
            return entries
        keys = [decode(self.name(i)) for i in entries.tolist()]
        order = sorted(range(len(keys)), key=keys.__getitem__)
        return entries[np.asarray(order, dtype=np.int64)]


# --------------------------------------------------------------------------- building


@dataclass
class _Listing:
    """Accumulates the files of one catalog, directory by directory."""

    dirs: list[str]
    name_entry: list[I64]
    dir_id: list[I64]
    label: list[I64]
    outside: list[str]
    exact: bool = True

    def add(self, d: str, files: I64, label: int) -> None:
        if files.size:
            self.name_entry.append(files)
            self.dir_id.append(np.full(files.size, len(self.dirs), np.int64))
            self.label.append(np.full(files.size, label, np.int64))
        self.dirs.append(d)


def _join(d: str, name: str) -> str:
    return f"{d}/{name}" if d else name


def _walk_dirs(view: _TreeView, top: int, rel: str, listing: _Listing) -> list[tuple[str, int]]:
    """Every directory ``os.walk(top, followlinks=True)`` visits, as (relative path, resolved dir).

    A link back to a directory on the current walk path would make os.walk recurse until the
    kernel gives up (ELOOP): ImageFolder's listing then depends on path limits, so it is refused.
    """
    out: list[tuple[str, int]] = []
    tree = view.tree
    stack: list[tuple[str, int, tuple[int, ...]]] = [(rel, top, (top,))]
    while stack:
        path, d, ancestors = stack.pop()
        out.append((path, d))
        children = np.arange(int(tree.child_start[d]), int(tree.child_start[d]) + int(tree.child_count[d]))
        for c in children[view.dirlike[children]].tolist():
            target = int(view.resolved[c])
            sub = _join(path, decode(view.name(c)))
            if target in ancestors:
                raise ValueError(f"symlink cycle at {sub!r}: the listing would depend on path limits")
            stack.append((sub, target, (*ancestors, target)))
        for c in children[view.outside[children]].tolist():
            listing.outside.append(_join(path, decode(view.name(c))))
    return out


def _dir_files(view: _TreeView, d: int, keep: Bools, listing: _Listing) -> I64:
    """Files os.walk lists in ``d`` that pass the filter, in ``sorted(fnames)`` order."""
    tree = view.tree
    children = np.arange(int(tree.child_start[d]), int(tree.child_start[d]) + int(tree.child_count[d]))
    files = children[~view.dirlike[children]]
    # a link leaving the tree with a non-matching name may be a directory os.walk would enter
    if (view.outside[files] & ~keep[files]).any():
        listing.exact = False
    return view.str_sorted(files[keep[files]])


def _resolve_root(tree: TreeArrays, root: str) -> int:
    norm = posixpath.normpath(root)
    if norm == ".":
        return 0
    if norm.startswith("/") or norm == ".." or norm.startswith("../"):
        raise ValueError(f"dataset root {root!r}: expected a path inside the source")
    found = _resolve_path(tree, encode(norm))
    if found < 0 or tree.kind[found] != KIND_DIR:
        raise ValueError(f"dataset root {root!r}: not a directory in the snapshot")
    return found


def _resolve_path(tree: TreeArrays, rel: bytes, dir_cache: dict[bytes, int] | None = None) -> int:
    """Entry of a relative path, following symlinks on the way; the last component unresolved.

    Returns -1 when a component is missing or an intermediate one is not a directory.
    """
    head, _, last = rel.rpartition(b"/")
    if dir_cache is not None and head in dir_cache:
        cur = dir_cache[head]
    else:
        cur = 0
        for part in head.split(b"/") if head else []:
            child = tree.find_child(cur, part) if cur >= 0 and tree.kind[cur] == KIND_DIR else -1
            cur = tree.resolve(child) if child >= 0 else -1
            if cur < 0:
                break
        if dir_cache is not None:
            dir_cache[head] = cur
    if cur < 0 or tree.kind[cur] != KIND_DIR:
        return -1
    return tree.find_child(cur, last)


def _imagefolder(view: _TreeView, top: int, extensions: tuple[str, ...]) -> tuple[_Listing, list[str]]:
    tree = view.tree
    listing = _Listing([], [], [], [], [])
    children = np.arange(int(tree.child_start[top]), int(tree.child_start[top]) + int(tree.child_count[top]))
    classes = sorted((decode(view.name(c)), int(view.resolved[c])) for c in children[view.dirlike[children]])
    for c in children[view.outside[children]].tolist():
        listing.outside.append(decode(view.name(c)))
        listing.exact = False  # may be a class directory we cannot see
    keep = view.ext_match(extensions)
    for label, (cname, cdir) in enumerate(classes):
        for rel, d in sorted(_walk_dirs(view, cdir, cname, listing)):
            listing.add(rel, _dir_files(view, d, keep, listing), label)
    return listing, [c for c, _ in classes]


def _files(view: _TreeView, top: int, extensions: tuple[str, ...] | None) -> _Listing:
    listing = _Listing([], [], [], [], [])
    keep = view.ext_match(extensions)
    for rel, d in sorted(_walk_dirs(view, top, "", listing)):
        listing.add(rel, _dir_files(view, d, keep, listing), -1)
    if not listing.name_entry:
        return listing
    name_entry = np.concatenate(listing.name_entry)
    dir_id = np.concatenate(listing.dir_id)
    keys = [
        _join(listing.dirs[d], decode(view.name(e))) for d, e in zip(dir_id.tolist(), name_entry.tolist(), strict=True)
    ]
    order = np.asarray(sorted(range(len(keys)), key=keys.__getitem__), dtype=np.int64)
    listing.name_entry = [name_entry[order]]
    listing.dir_id = [dir_id[order]]
    listing.label = [np.full(order.size, -1, np.int64)]
    return listing


_DIGITS = re.compile(r"(\d+)")


def natural_key(s: str) -> list[str | int]:
    """timm's sort key: lower-cased, digit runs (odd split positions) compared as numbers."""
    parts: list[str | int] = list(_DIGITS.split(s.lower()))
    parts[1::2] = map(int, parts[1::2])  # the digit runs
    return parts


def _natural_run(m: re.Match[str]) -> str:
    digits = str(int(m.group()))  # \d matches every Unicode digit, as in timm: its value, in ASCII
    return f"\0{chr(0x100 + len(digits))}{digits}"


def natural_sort_key(s: str) -> str:
    """:func:`natural_key` as one string that sorts (and ties) alike, for sorting millions of paths.

    Each text part ends with NUL (no name holds one), so a part that is a prefix of another sorts
    first, as in the list; each digit run becomes its length (a character above every digit and
    NUL) and its digits without leading zeros, so runs compare by value, as ints do.
    """
    return _DIGITS.sub(_natural_run, s.lower()) + "\0"


def _splitext_ext(name: str) -> str:
    """``os.path.splitext(name)[1]`` for a base name: from the last dot, unless only dots precede it."""
    dot = name.rfind(".")
    return name[dot:] if dot > len(name) - len(name.lstrip(".")) else ""


def _timm_folder(view: _TreeView, top: int, extensions: tuple[str, ...]) -> tuple[_Listing, list[str]]:
    types = set(extensions)
    listing = _Listing([], [], [], [], [])
    keep = view.ext_match(extensions)  # endswith: a superset of the splitext rule, refined below
    paths: list[str] = []
    entries: list[int] = []
    dir_ids: list[int] = []
    names: list[str] = []
    for rel, d in _walk_dirs(view, top, "", listing):
        leaf = posixpath.basename(rel)  # the class: the name of the directory the file sits in
        prefix = f"{rel}/" if rel else ""
        for e in _dir_files(view, d, keep, listing).tolist():
            name = decode(view.name(e))
            if _splitext_ext(name).lower() in types:
                paths.append(prefix + name)
                entries.append(e)
                dir_ids.append(len(listing.dirs))
                names.append(leaf)
        listing.dirs.append(rel)
    classes = sorted(set(names), key=lambda c: (natural_key(c), c))
    keys = [natural_sort_key(p) for p in paths]
    # (key, path, position) sorted as tuples: the order of sorted(range(n), key=(keys[k], paths[k]))
    order = [k for _key, _path, k in sorted(zip(keys, paths, range(len(paths)), strict=True))]
    class_keys = [natural_key(c) for c in classes]
    ties = any(a == b for a, b in itertools.pairwise(class_keys))
    ties = ties or any(keys[a] == keys[b] for a, b in itertools.pairwise(order))
    if ties:
        listing.exact = False
    index = {c: i for i, c in enumerate(classes)}
    pick = np.asarray(order, dtype=np.int64)
    listing.name_entry = [np.asarray(entries, dtype=np.int64)[pick]]
    listing.dir_id = [np.asarray(dir_ids, dtype=np.int64)[pick]]
    listing.label = [np.asarray([index[n] for n in names], dtype=np.int64)[pick]]
    return listing, classes


def _explicit(view: _TreeView, top: int, paths: Sequence[str]) -> _Listing:
    tree = view.tree
    prefix = b"" if top == 0 else tree.path(top) + b"/"
    listing = _Listing([], [], [], [], [])
    dir_ids: dict[str, int] = {}
    dir_cache: dict[bytes, int] = {}
    name_entry = np.empty(len(paths), np.int64)
    dir_id = np.empty(len(paths), np.int64)
    for k, raw in enumerate(paths):
        norm = posixpath.normpath(raw.strip())
        if norm in (".", "") or norm.startswith("/") or norm == ".." or norm.startswith("../"):
            raise ValueError(f"list entry {k + 1} {raw!r}: expected a file path relative to the dataset root")
        found = _resolve_path(tree, prefix + encode(norm), dir_cache)
        if found < 0:
            raise ValueError(f"list entry {k + 1} {raw!r}: no such file in the snapshot")
        if view.dirlike[found]:
            raise ValueError(f"list entry {k + 1} {raw!r}: is a directory")
        if view.outside[found]:
            listing.outside.append(norm)
        d = posixpath.dirname(norm)
        if d not in dir_ids:
            dir_ids[d] = len(listing.dirs)
            listing.dirs.append(d)
        name_entry[k] = found
        dir_id[k] = dir_ids[d]
    listing.name_entry = [name_entry]
    listing.dir_id = [dir_id]
    listing.label = [np.full(len(paths), -1, np.int64)]
    return listing


def build_catalog(
    tree: TreeArrays,
    root: str = ".",
    layout: str = "imagefolder",
    extensions: Sequence[str] | None = None,
    paths: Sequence[str] | None = None,
    *,
    _view: _TreeView | None = None,
) -> Catalog:
    """The catalog of the dataset at ``root`` (relative to the tree's root).

    ``extensions``: kept suffixes, matched case-insensitively (default: ImageFolder's for
    imagefolder, timm's for timm_folder, everything for files; ignored for list).  ``paths``: the list layout's entries.
    Raises ValueError with a one-line reason when the listing cannot be reproduced.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {', '.join(LAYOUTS)}, got {layout!r}")
    view = _view if _view is not None else _TreeView(tree)
    top = _resolve_root(tree, root)
    exts = None if extensions is None else tuple(e.lower() for e in extensions)
    classes: list[str] = []
    if layout == "imagefolder":
        listing, classes = _imagefolder(view, top, exts if exts is not None else IMG_EXTENSIONS)
    elif layout == "files":
        listing = _files(view, top, exts)
    elif layout == "timm_folder":
        listing, classes = _timm_folder(view, top, exts if exts is not None else TIMM_EXTENSIONS)
    else:
        if paths is None:
            raise ValueError("layout 'list' needs the list of paths (list_file)")
        listing = _explicit(view, top, paths)
    if listing.name_entry:
        name_entry = np.concatenate(listing.name_entry)
        dir_id = np.concatenate(listing.dir_id).astype(np.int32)
        label = np.concatenate(listing.label).astype(np.int32)
    else:
        name_entry = np.zeros(0, np.int64)
        dir_id = np.zeros(0, np.int32)
        label = np.zeros(0, np.int32)
    if len(tree) >= 2**31:
        raise ValueError("tree has more than 2**31 entries")
    resolved = view.resolved[name_entry]
    readable = view.readable[name_entry]
    entry = np.where(resolved >= 0, resolved, name_entry).astype(np.int32)
    size = np.where(readable, tree.size[entry], 0).astype(np.int64)
    return Catalog(
        root=posixpath.normpath(root),
        layout=layout,
        entry=entry,
        size=size,
        label=label,
        readable=readable,
        name_entry=name_entry.astype(np.int32),
        dir_id=dir_id,
        dirs=tuple(listing.dirs),
        classes=tuple(classes),
        outside_links=tuple(listing.outside),
        exact=listing.exact,
    )


def build_catalogs(
    tree: TreeArrays, config: Mapping[str, Any], lists: Mapping[int, Sequence[str]] | None = None
) -> list[Catalog]:
    """One catalog per configured dataset (``config`` is ``Config.to_dict()``).

    ``lists[i]``: the lines of dataset i's list_file (layout 'list'), read by the caller.
    """
    out = []
    view = _TreeView(tree)  # shared: the per-entry columns cost more than a listing
    for i, ds in enumerate(config["datasets"]):
        paths = None
        if ds["layout"] == "list":
            if lists is None or i not in lists:
                raise ValueError(f"datasets.{i}: layout 'list' needs the contents of {ds.get('list_file')}")
            paths = [p for p in lists[i] if p.strip()]
        layout = ds["layout"] or DEFAULT_LAYOUT
        try:
            out.append(build_catalog(tree, ds["root"], layout, ds.get("extensions"), paths, _view=view))
        except ValueError as exc:
            raise ValueError(f"datasets.{i}: {exc}") from None
    return out
