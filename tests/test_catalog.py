"""The catalog lists files in exactly the order the training code indexes them (real ImageFolder)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from fusefs.meta.snapshot import Snapshot
from placement.catalog import Catalog, build_catalog, build_catalogs
from tools.harness import torchvision_cpu

LATIN1 = b"\x80x.jpg"  # not UTF-8: str sort puts it (\udc80) after CJK, bytes sort before
CJK = "中.jpg".encode()
HIGH = b"\xff.jpg"  # \udcff sorts before U+E000 as str, after it as bytes
PRIVATE = "\ue000.jpg".encode()


def _write(path: Path | bytes, data: bytes = b"x") -> None:
    with open(path, "wb") as fh:
        fh.write(data)


def imagefolder_tree(root: Path, outside_target: Path | None = None) -> Path:
    """Every case where a naive listing would disagree with ImageFolder."""
    cls = root / "cls"
    (cls / "sub-dir").mkdir(parents=True)
    (cls / "sub" / "deeper").mkdir(parents=True)
    (cls / ".hidden_sub").mkdir()
    for rel in ["a.jpg", "B.JPEG", "c.PnG", ".dot.jpg", "sub-dir/x.jpg", "sub/y.webp", "sub/deeper/z.TIFF"]:
        _write(cls / rel, rel.encode() * 3)
    _write(cls / ".hidden_sub" / "h.bmp")
    _write(cls / "notes.txt")
    _write(cls / "jpg")  # ends with "jpg" but not ".jpg"
    odd = root / "odd"
    odd.mkdir()
    for name in (LATIN1, CJK, HIGH, PRIVATE, b"plain.jpg"):
        _write(os.path.join(os.fsencode(odd), name), name)
    (root / "empty").mkdir()
    (root / ".hidden_class").mkdir()
    _write(root / ".hidden_class" / "k.ppm", b"k" * 10)
    _write(root / "root_file.jpg")  # files at the root are not samples
    os.symlink("cls", root / "linked_class")  # a symlinked class dir: every file listed twice
    os.symlink("../cls/a.jpg", root / "odd" / "file_link.jpg")
    os.symlink("../cls/sub", root / "odd" / "dir_link")
    os.symlink("missing.jpg", root / "odd" / "dangling.jpg")
    if outside_target is not None:
        os.symlink(str(outside_target), root / "odd" / "outside.jpg")
    return root


def relsamples(root: Path) -> tuple[list[str], list[tuple[str, int]]]:
    ds = torchvision_cpu.image_folder(str(root), loader=lambda p: p, allow_empty=True)
    return list(ds.classes), [(os.path.relpath(p, root), t) for p, t in ds.samples]


@pytest.mark.torch
def test_imagefolder_order_labels_entries_and_sizes_match_torchvision(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.jpg"
    _write(outside, b"outside")
    root = imagefolder_tree(tmp_path / "ds", outside_target=outside)
    tree = Snapshot.scan(str(root)).tree
    cat = build_catalog(tree)
    classes, samples = relsamples(root)
    assert list(cat.classes) == classes
    assert [(cat.path(i, tree), int(cat.label[i])) for i in range(len(cat))] == samples
    assert cat.outside_links == ("odd/outside.jpg",)
    real_root = os.path.realpath(root)
    for i, (rel, _) in enumerate(samples):
        full = os.path.join(root, rel)
        real = os.path.realpath(full)
        inside = real.startswith(real_root + os.sep) and os.path.exists(real)
        assert bool(cat.readable[i]) == inside, rel
        if inside:
            assert int(cat.entry[i]) == tree.lookup(os.fsencode(os.path.relpath(real, real_root))), rel
            assert int(cat.size[i]) == os.path.getsize(full), rel
        else:
            assert int(cat.size[i]) == 0


@pytest.mark.torch
def test_cases_that_break_naive_orders_are_present(tmp_path: Path) -> None:
    """Guards the test above: bytes order and depth-first order really differ from ImageFolder's."""
    root = imagefolder_tree(tmp_path / "ds")
    _, samples = relsamples(root)
    odd = [os.fsencode(p).split(b"/", 1)[1] for p, _ in samples if p.startswith("odd/")]
    assert odd != sorted(odd)  # str order is not bytes order here
    cls = [p for p, _ in samples if p.startswith("cls/")]
    # sorted dirpaths: "sub" < "sub-dir" < "sub/deeper" ('-' < '/'), not depth-first
    assert cls.index("cls/sub/y.webp") < cls.index("cls/sub-dir/x.jpg") < cls.index("cls/sub/deeper/z.TIFF")
    assert "cls/.dot.jpg" in cls and "cls/.hidden_sub/h.bmp" in cls
    tree = Snapshot.scan(str(root)).tree
    cat = build_catalog(tree)
    shared = {int(e) for e, r in zip(cat.entry, cat.readable, strict=True) if r}
    assert len(shared) < int(cat.readable.sum())  # the linked class shares entries with cls


def test_dataset_root_inside_the_source_and_plain_file_layout(tmp_path: Path) -> None:
    src = tmp_path / "src"
    root = imagefolder_tree(src / "train")
    tree = Snapshot.scan(str(src)).tree
    cat = build_catalog(tree, "train", "files")
    expected = []
    for dirpath, _, fnames in os.walk(os.fsencode(root), followlinks=True):
        for f in fnames:
            expected.append(os.fsdecode(os.path.relpath(os.path.join(dirpath, f), os.fsencode(root))))
    assert list(cat.paths(tree)) == sorted(expected)
    assert (cat.label == -1).all()
    jpgs = build_catalog(tree, "train", "files", extensions=[".JPG"])
    assert list(jpgs.paths(tree)) == sorted(p for p in expected if p.lower().endswith(".jpg"))


def test_extension_matching_uses_str_lower_for_non_ascii_names(tmp_path: Path) -> None:
    """'\u212a' (Kelvin sign) lower-cases to ASCII 'k': only str semantics catch it."""
    root = tmp_path / "ds"
    root.mkdir()
    for name in ("a.K", "b.\u212a", "c.k", "d.x"):
        _write(root / name)
    tree = Snapshot.scan(str(root)).tree
    cat = build_catalog(tree, ".", "files", extensions=[".k"])
    assert list(cat.paths(tree)) == ["a.K", "b.\u212a", "c.k"]


def test_explicit_list_resolves_links_and_rejects_unknown_paths(tmp_path: Path) -> None:
    root = imagefolder_tree(tmp_path / "ds")
    tree = Snapshot.scan(str(root)).tree
    paths = ["odd/dir_link/y.webp", "./cls/a.jpg", "odd/dangling.jpg", "linked_class/B.JPEG"]
    cat = build_catalog(tree, ".", "list", paths=paths)
    assert list(cat.paths(tree)) == [p.removeprefix("./") for p in paths]
    assert int(cat.entry[0]) == tree.lookup(b"cls/sub/y.webp")
    assert int(cat.entry[3]) == tree.lookup(b"cls/B.JPEG")
    assert cat.readable.tolist() == [True, True, False, True]
    for bad, why in (("nope.jpg", "no such file"), ("cls/sub", "is a directory"), ("../x", "relative")):
        with pytest.raises(ValueError, match=why):
            build_catalog(tree, ".", "list", paths=[bad])


def test_symlink_cycle_is_refused_not_looped(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    (root / "c" / "d").mkdir(parents=True)
    _write(root / "c" / "d" / "f.jpg")
    os.symlink("..", root / "c" / "d" / "up")
    tree = Snapshot.scan(str(root)).tree
    with pytest.raises(ValueError, match="symlink cycle"):
        build_catalog(tree)


def test_catalogs_per_dataset_and_roundtrip_digest(tmp_path: Path) -> None:
    src = tmp_path / "src"
    imagefolder_tree(src / "train")
    imagefolder_tree(src / "val")
    tree = Snapshot.scan(str(src)).tree
    config = {
        "datasets": [
            {"root": "train", "layout": "imagefolder", "extensions": None},
            {"root": "val", "layout": "list", "list_file": "v.txt", "extensions": None},
        ]
    }
    with pytest.raises(ValueError, match=r"datasets\.1: layout 'list' needs"):
        build_catalogs(tree, config)
    train, val = build_catalogs(tree, config, {1: ["cls/a.jpg", "", "odd/plain.jpg"]})
    assert len(val) == 2 and train.root == "train"
    again = Catalog.from_parts(train.meta(), {k: v.copy() for k, v in train.arrays().items()})
    assert again.digest() == train.digest() and again.dirs == train.dirs and again.classes == train.classes
    changed = Catalog.from_parts(train.meta(), {**train.arrays(), "size": train.size + 1})
    assert changed.digest() != train.digest()
    assert np.array_equal(again.entry, train.entry)
