"""Source trees with every awkward case the mirror must reproduce exactly."""

from __future__ import annotations

import os
from pathlib import Path

NON_UTF8 = b"caf\xe9.jpg"  # latin-1 bytes: not decodable as UTF-8


def tricky_tree(root: Path, big_mb: int = 20) -> Path:
    """Nested classes, a subdir in a class, odd names, dotfiles, empty dir, 0-byte and big files, links."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "cat" / "sub").mkdir(parents=True)
    (root / "dog").mkdir()
    (root / "bird" / "nested" / "deeper").mkdir(parents=True)
    (root / "empty_dir").mkdir()
    (root / ".hidden_dir").mkdir()
    (root / "cat" / "a.jpg").write_bytes(os.urandom(3000))
    (root / "cat" / "B.JPEG").write_bytes(os.urandom(1234))
    (root / "cat" / "sub" / "c.png").write_bytes(os.urandom(777))
    (root / "cat" / "with space.jpg").write_bytes(b"space")
    (root / "cat" / "ünïcödé.jpg").write_bytes("ünïcödé".encode())
    (root / "cat" / ".dotfile.jpg").write_bytes(b"dot")
    (root / "cat" / "notes.txt").write_text("not an image\n")
    with open(os.path.join(os.fsencode(root / "dog"), NON_UTF8), "wb") as fh:
        fh.write(b"non-utf8 name")
    (root / "dog" / "zero.jpg").write_bytes(b"")
    (root / "dog" / "big.jpg").write_bytes(os.urandom(big_mb << 20))
    (root / "bird" / "nested" / "deeper" / "d.jpg").write_bytes(os.urandom(100))
    (root / "bird" / "x.bmp").write_bytes(os.urandom(55))
    (root / ".hidden_dir" / "h.jpg").write_bytes(b"hidden")
    (root / "root_file.jpg").write_bytes(b"files at the root are not samples")
    os.chmod(root / "bird" / "x.bmp", 0o640)
    os.symlink("../cat/a.jpg", root / "dog" / "link_to_file.jpg")
    os.symlink("../cat", root / "dog" / "link_to_dir")
    os.symlink("nowhere.jpg", root / "dog" / "dangling.jpg")
    os.symlink("cat", root / "cat_link")  # a symlinked class dir
    os.utime(root / "cat" / "a.jpg", ns=(1_600_000_000_123_456_789, 1_500_000_000_987_654_321))
    return root


def describe(root: str | os.PathLike[str]) -> dict[bytes, tuple[object, ...]]:
    """Every entry under ``root`` (bytes paths, no following links) -> type, size, mode, mtime, target."""
    out: dict[bytes, tuple[object, ...]] = {}
    base = os.fsencode(root)
    for dirpath, dirnames, filenames in os.walk(base):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            rel = os.path.relpath(full, base)
            target = os.readlink(full) if os.path.islink(full) else None
            size = st.st_size if not os.path.isdir(full) or os.path.islink(full) else None
            out[rel] = (st.st_mode, size, st.st_mtime_ns, st.st_uid, st.st_gid, target)
    return out
