"""The catalog lists files in exactly the order the training code indexes them (real ImageFolder)."""

from __future__ import annotations

import itertools
import os
import random
from pathlib import Path

import numpy as np
import pytest
from trees import tricky_tree

from fusefs.meta.snapshot import Snapshot
from placement.catalog import Catalog, build_catalog, build_catalogs, natural_key, natural_sort_key
from placement.tree import KIND_DIR
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


def timm_tree(root: Path) -> Path:
    """Every case where a plain sorted walk would disagree with timm's folder reader."""
    for rel in [
        "class2/img_10.jpg",
        "class2/img_2.JPG",  # upper-case extension, and 2 < 10 only as numbers
        "class10/img_1.png",
        "Class3/img_1.jpeg",  # lower-cased before comparing: between class2 and class10
        "nested/a/leaf/x_3.jpg",  # class 'leaf', not 'nested_a_leaf'
        "other/leaf/x_20.png",  # the same class name in another branch: one class
        "other/leaf/notes.txt",  # not an image
        "other/leaf/.png",  # splitext('.png') has no extension
        "other/leaf/photo.webp",  # not one of timm's defaults
        "empty/readme.md",  # a directory without images is no class
        "root_9.jpg",  # files at the root are samples, class ''
        "root_10.png",
    ]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        _write(root / rel, rel.encode())
    os.symlink("class2", root / "class2_link")  # walked: its files appear under the link's path
    return root


def timm_samples(root: Path, types: list[str] | None = None) -> tuple[list[str], list[tuple[str, int]]]:
    torchvision_cpu.load()  # timm imports torchvision
    reader = pytest.importorskip("timm.data.readers.reader_image_folder", reason="timm is not installed")
    samples, class_to_idx = reader.find_images_and_targets(str(root), types=types)
    classes = sorted(class_to_idx, key=class_to_idx.__getitem__)
    return classes, [(os.path.relpath(p, root), t) for p, t in samples]


@pytest.mark.torch
def test_timm_folder_order_and_labels_match_timm(tmp_path: Path) -> None:
    root = timm_tree(tmp_path / "ds")
    tree = Snapshot.scan(str(root)).tree
    cat = build_catalog(tree, layout="timm_folder")
    classes, samples = timm_samples(root)
    assert list(cat.classes) == classes
    assert [(cat.path(i, tree), int(cat.label[i])) for i in range(len(cat))] == samples
    assert cat.exact and cat.readable.all()
    # the cases are really present: numeric order, leaf labels, root files and the link
    paths = [p for p, _ in samples]
    assert paths.index("class2/img_2.JPG") < paths.index("class2/img_10.jpg") < paths.index("class10/img_1.png")
    assert paths.index("root_9.jpg") < paths.index("root_10.png") and "class2_link/img_2.JPG" in paths
    assert "leaf" in classes and "" in classes and "empty" not in classes
    configured = build_catalog(tree, layout="timm_folder", extensions=[".webp", ".txt"])
    assert [(configured.path(i, tree), int(configured.label[i])) for i in range(len(configured))] == (
        timm_samples(root, [".webp", ".txt"])[1]
    )


def test_timm_folder_ties_are_broken_by_str_and_not_exact(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    (root / "c").mkdir(parents=True)
    for name in ("img1.jpg", "img01.jpg", "img2.jpg"):
        _write(root / "c" / name)
    cat = build_catalog(Snapshot.scan(str(root)).tree, layout="timm_folder")
    assert not cat.exact  # timm keeps os.scandir's order for img1/img01, which a snapshot does not record
    assert list(cat.paths(Snapshot.scan(str(root)).tree)) == ["c/img01.jpg", "c/img1.jpg", "c/img2.jpg"]


def test_the_one_string_natural_key_sorts_and_ties_as_timms_list_key() -> None:
    """The timm_folder layout sorts millions of paths by natural_sort_key (a string: C comparisons),
    not by timm's list key: both must order, and tie, every pair alike (Unicode digits included)."""
    rng = random.Random(2)
    alphabet = "ab0123456789_./-AZ\u0660\u0661\u0662"
    for _ in range(100_000):
        a, b = ("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8))) for _ in range(2))
        ka, kb, sa, sb = natural_key(a), natural_key(b), natural_sort_key(a), natural_sort_key(b)
        assert ((ka < kb), (ka == kb)) == ((sa < sb), (sa == sb)), (a, b)


def test_find_child_and_path_agree_with_the_tree_on_disk(tmp_path: Path) -> None:
    """Every entry of a scanned tree with awkward names (non-UTF-8, spaces, dotfiles, links) is found
    by its parent and name and has its path on disk; names before, between and after a directory's
    children are not found.  Evidence: os.walk of the source, not the arrays."""
    root = tricky_tree(tmp_path / "src", big_mb=0)
    tree = Snapshot.scan(str(root)).tree
    on_disk = set()
    for dirpath, dirnames, filenames in os.walk(os.fsencode(root)):
        for name in dirnames + filenames:
            on_disk.add(os.path.relpath(os.path.join(dirpath, name), os.fsencode(root)))
    found = set()
    for i in range(1, len(tree)):
        path = tree.path(i)
        parent = int(tree.parent[i])
        assert tree.find_child(parent, path.rsplit(b"/", 1)[-1]) == i, path
        found.add(path)
    assert found == on_disk
    for d in range(len(tree)):
        if tree.kind[d] == KIND_DIR:
            assert tree.find_child(d, b"") == -1 and tree.find_child(d, b"\xff\xff") == -1
            kids = tree.children(d)
            names = tree.names_of(kids.start, kids.stop)
            for a, b in itertools.pairwise(names):
                assert tree.find_child(d, a + b"\0") == -1 or a + b"\0" == b
