"""Generate a synthetic ImageFolder tree: classes, lognormal file sizes, optional real JPEGs.

Deterministic for a given --seed, so benchmarks and tests can regenerate the same tree.  With
``--jpeg`` every file is a decodable JPEG padded to its drawn size with COM segments (so sizes stay
exact); otherwise files hold random bytes with a ``.jpg`` name (read them with a bytes loader).
With ``--photos`` every file is a real JPEG whose pixels fill it: a crop, sized so the file comes out
near its drawn size, of one smooth, noisy texture (ImageNet-like: ~110 KB is ~590x440 pixels at
quality 90), so decoding it costs what decoding a photo of that size does (the padded ``--jpeg``
files are 16x16 pixels and decode for free).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ODD_NAMES = ["ünïcödé näme.jpg", "with space.JPG", ".hidden.jpeg", "UPPER.PNG"]
ODD_BYTES_NAME = b"latin1-\xe9t\xe9.jpg"  # not valid UTF-8: exercises bytes names end to end


@dataclass(frozen=True)
class Spec:
    classes: int = 10
    files: int = 1000  # total over all classes (train split)
    val_files: int = 0  # > 0: create train/ and val/ with this many files in val
    mean_size: int = 110_000
    sigma: float = 0.5  # of the underlying normal; sizes are lognormal around mean_size
    jpeg: bool = False
    nest: int = 0  # extra directory levels inside each class
    odd_names: bool = False
    seed: int = 0
    photos: bool = False  # real JPEGs whose pixels fill the file (decoding costs what a photo's does)


def parse_size(text: str) -> int:
    units = {"": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 10**6, "mb": 10**6, "mib": 1 << 20}
    t = text.strip().lower()
    num = t.rstrip("kmib")
    unit = t[len(num) :]
    if unit not in units or not num:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (e.g. 110KB, 2MiB, 4096)")
    return int(float(num) * units[unit])


def lognormal_sizes(rng: np.random.Generator, n: int, mean: int, sigma: float) -> np.ndarray:
    """Sizes whose mean is ``mean`` (mu chosen so E[X] = exp(mu + sigma^2/2) = mean)."""
    mu = np.log(max(mean, 1)) - sigma**2 / 2
    return np.maximum(1, rng.lognormal(mu, sigma, n)).astype(np.int64)


def jpeg_bytes(rng: np.random.Generator, size: int) -> bytes:
    """A valid JPEG of exactly ``size`` bytes when size allows (COM padding after SOI)."""
    from PIL import Image

    side = 16
    pixels = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=80)
    core = buf.getvalue()
    pad = size - len(core)
    segments = []
    while pad >= 4:
        body = min(pad - 4, 65533)
        segments.append(b"\xff\xfe" + (body + 2).to_bytes(2, "big") + b"\0" * body)
        pad -= body + 4
    return core[:2] + b"".join(segments) + core[2:]


PHOTO_BYTES_PER_PIXEL = 0.42
"""What a crop of :func:`_texture` takes per pixel as a quality-90 JPEG (measured: 0.416-0.428)."""
_TEXTURE_SIDE = 1536
_TEXTURES: list[np.ndarray] = []


def _texture() -> np.ndarray:
    """One 1536x1536 RGB texture (smooth waves and noise, fixed seed), made once per process."""
    if not _TEXTURES:
        r = np.random.default_rng(12345)
        y, x = np.mgrid[0:_TEXTURE_SIDE, 0:_TEXTURE_SIDE].astype(np.float32)
        img = np.empty((_TEXTURE_SIDE, _TEXTURE_SIDE, 3), np.float32)
        for c in range(3):
            fx, fy, ph = r.uniform(0.004, 0.03), r.uniform(0.004, 0.03), r.uniform(0, 6.28)
            img[..., c] = 128 + 70 * np.sin(x * fx + ph) * np.cos(y * fy + c)
        img += r.normal(0, 14, img.shape)
        _TEXTURES.append(np.clip(img, 0, 255).astype(np.uint8))
    return _TEXTURES[0]


def photo_bytes(rng: np.random.Generator, size: int) -> bytes:
    """A quality-90 JPEG of about ``size`` bytes whose pixels fill it (4:3, cropped from one texture)."""
    from PIL import Image

    tex = _texture()
    w = max(16, min(_TEXTURE_SIDE, int((size / PHOTO_BYTES_PER_PIXEL * 4 / 3) ** 0.5)))
    h = max(12, min(_TEXTURE_SIDE, w * 3 // 4))
    ox, oy = (int(v) for v in rng.integers(0, [_TEXTURE_SIDE - w + 1, _TEXTURE_SIDE - h + 1]))
    buf = io.BytesIO()
    Image.fromarray(tex[oy : oy + h, ox : ox + w]).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _file_bytes(rng: np.random.Generator, spec: Spec, size: int) -> bytes:
    if spec.photos:
        return photo_bytes(rng, size)
    return jpeg_bytes(rng, size) if spec.jpeg else rng.bytes(size)


def _class_names(n: int) -> list[str]:
    return [f"n{c:08d}" for c in range(n)]


def make_split(root: Path, spec: Spec, nfiles: int, rng: np.random.Generator) -> list[Path]:
    written: list[Path] = []
    classes = _class_names(spec.classes)
    sizes = lognormal_sizes(rng, nfiles, spec.mean_size, spec.sigma)
    for k in range(nfiles):
        cls = classes[k % spec.classes]
        sub = Path(cls, *[f"d{(k // spec.classes) % 3}_{lvl}" for lvl in range(spec.nest)])
        d = root / sub
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"img_{k:07d}.jpg"
        data = _file_bytes(rng, spec, int(sizes[k]))
        path.write_bytes(data)
        written.append(path)
    if spec.odd_names and classes:
        odd_dir = root / classes[0]
        for name in ODD_NAMES:
            p = odd_dir / name
            p.write_bytes(_file_bytes(rng, spec, 2000))
            written.append(p)
        p_bytes = os.path.join(os.fsencode(odd_dir), ODD_BYTES_NAME)
        with open(p_bytes, "wb") as fh:
            fh.write(rng.bytes(1000))
        written.append(Path(os.fsdecode(p_bytes)))
        (root / classes[0] / "notes.txt").write_text("not an image: ImageFolder skips it\n")
    return written


def make_dataset(root: str | os.PathLike[str], spec: Spec) -> list[Path]:
    """Create the tree under ``root`` (which must not exist or be empty); returns the files written."""
    out = Path(root)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(spec.seed)
    if spec.val_files > 0:
        files = make_split(out / "train", spec, spec.files, rng)
        files += make_split(out / "val", spec, spec.val_files, rng)
        return files
    return make_split(out, spec, spec.files, rng)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mkdataset",
        description="Generate a synthetic ImageFolder dataset (class directories of image files).",
    )
    p.add_argument("root", help="directory to create (must be empty or absent)")
    p.add_argument("--classes", type=int, default=Spec.classes, help="number of class directories (default 10)")
    p.add_argument("--files", type=int, default=Spec.files, help="number of (train) files (default 1000)")
    p.add_argument("--val-files", type=int, default=0, help="also create val/ with N files (puts the rest in train/)")
    p.add_argument("--mean-size", type=parse_size, default=Spec.mean_size, help="mean file size (default 110KB)")
    p.add_argument("--sigma", type=float, default=Spec.sigma, help="lognormal sigma of sizes (default 0.5)")
    p.add_argument("--jpeg", action="store_true", help="write decodable JPEGs (padded to size) instead of random bytes")
    p.add_argument(
        "--photos",
        action="store_true",
        help="write real JPEGs whose pixels fill each file (about its drawn size): decoding costs what a photo's does",
    )
    p.add_argument("--nest", type=int, default=0, help="extra directory levels inside each class (default 0)")
    p.add_argument("--odd-names", action="store_true", help="add unicode, space, dotfile, non-UTF-8 names")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    root = Path(a.root)
    if root.exists() and any(root.iterdir()):
        print(f"mkdataset: {root}: not empty", file=sys.stderr)
        return 1
    if a.classes < 1 or a.files < 0 or a.val_files < 0 or a.mean_size < 1:
        print("mkdataset: --classes, --files, --val-files and --mean-size must be positive", file=sys.stderr)
        return 2
    spec = Spec(a.classes, a.files, a.val_files, a.mean_size, a.sigma, a.jpeg, a.nest, a.odd_names, a.seed, a.photos)
    files = make_dataset(root, spec)
    total = sum(f.stat().st_size for f in files)
    print(f"mkdataset: {len(files)} files, {total / 1e6:.1f} MB in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
