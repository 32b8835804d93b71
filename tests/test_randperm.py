"""placement.randperm reproduces torch.randperm (torch 2.13, CPU) bit for bit, with and without torch.

The reference is always real torch: its randperm, its generator's draws, and for the 64-bit loop
(which torch only runs from n = 214,748,364 on) a line-by-line Python transcription of
``randperm_cpu`` fed with torch's own 64-bit draws, checked first on the 32-bit loop against
torch.randperm itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from placement import randperm as rp

SEEDS = [0, 1, 42, 2**32 + 5, 2**63 - 1, 2**64 - 1, -1, -(2**63)]
REPO = Path(__file__).resolve().parents[1]


def torch_perm(n: int, seed: int) -> np.ndarray:
    g = torch.Generator()
    g.manual_seed(seed)  # torch's own handling of the seed, no masking on our side
    return torch.randperm(n, generator=g).numpy()


def torch_random64(seed: int, k: int) -> np.ndarray:
    """k values of the generator's random64(): random_ over the full int64 range returns them raw."""
    g = torch.Generator()
    g.manual_seed(seed)
    return torch.empty(k, dtype=torch.int64).random_(-(2**63), None, generator=g).numpy().view(np.uint64)


def torch_loop_32(n: int, seed: int) -> list[int]:
    """randperm_cpu's n < 214,748,364 loop, transcribed, on torch's draws (2 per random64 call)."""
    r64 = torch_random64(seed, n // 2 + 1)
    draws = [int(x) >> 32 if i % 2 == 0 else int(x) & 0xFFFFFFFF for x in r64 for i in (0, 1)]
    a = list(range(n))
    for i in range(n - 1):
        z = draws[i] % (n - i)
        a[i], a[i + z] = a[i + z], a[i]
    return a


def torch_loop_64(n: int, seed: int) -> list[int]:
    """randperm_cpu's n >= 214,748,364 loop, transcribed, on torch's random64() draws."""
    r64 = torch_random64(seed, n)
    a = [0] * n
    for i in range(n):
        z = int(r64[i]) % (i + 1)
        a[i] = i
        a[i] = a[z]
        a[z] = i
    return a


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 17, 1000, 4097, 65539])
@pytest.mark.parametrize("seed", SEEDS)
def test_numpy_randperm_equals_torch(n: int, seed: int) -> None:
    got = rp.randperm(n, seed, backend="numpy")
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, torch_perm(n, seed))


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 5000), seed=st.integers(rp.SEED_MIN, rp.SEED_MAX))
def test_numpy_randperm_equals_torch_for_any_seed(n: int, seed: int) -> None:
    np.testing.assert_array_equal(rp.randperm(n, seed, backend="numpy"), torch_perm(n, seed))


def test_imagenet_size_numpy_equals_torch() -> None:
    n = 1_281_167
    for seed in (0, 2**63 - 1):
        np.testing.assert_array_equal(rp.randperm(n, seed, backend="numpy"), torch_perm(n, seed))


@pytest.mark.parametrize("n", [2, 3, 17, 1000, 65539, 2_000_003])
@pytest.mark.parametrize("seed", [0, 42, 2**63 - 1, -1])
def test_a_few_entries_equal_torch(n: int, seed: int) -> None:
    """randperm_at replays only the asked entries (a node's strided share, the padding's head, the
    last entry, duplicates, any order) and gives torch's values; past 1 asked in 16 (32 up to 8M files) it indexes the
    whole permutation instead."""
    want = torch_perm(n, seed)
    world = max(2, n // 64)
    rng = np.random.default_rng(n)
    asks = [
        np.concatenate([np.arange(3, n, world), np.arange(4, n, world), np.arange(min(n, 5))]),
        np.array([n - 1, 0, n - 1]),
        rng.integers(0, n, max(1, n // 40)),
        rng.integers(0, n, n),
    ]
    for at in asks:
        np.testing.assert_array_equal(rp.randperm_at(n, seed, at, backend="numpy"), want[at])
    np.testing.assert_array_equal(rp.randperm_at(n, seed, asks[0], backend="torch"), want[asks[0]])


@settings(max_examples=150, deadline=None)
@given(n=st.integers(2, 3000), seed=st.integers(rp.SEED_MIN, rp.SEED_MAX), data=st.data())
def test_the_partial_replay_equals_torch_for_any_entries(n: int, seed: int, data: st.DataObject) -> None:
    """The partial replay itself, whatever share of the entries is asked (randperm_at would take
    the whole permutation past 1 in 32 at these sizes)."""
    at = np.array(sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1))), dtype=np.int64)
    got = rp._forward_fisher_yates_at(rp._offsets_32(n, rp.Mt19937Stream(seed)), n, at)
    np.testing.assert_array_equal(got, torch_perm(n, seed)[at])


def test_one_nodes_share_of_14_million_equals_torch() -> None:
    """About 1.5 s.  Past 8M files (1 in 16 replayed alone, the per-size arrays no longer cached): node 5's entries
    of 1,024 nodes x 8 ranks and the padding's head, as a per-node plan asks them."""
    n, world = 14_000_000, 8192
    at = np.concatenate([(np.arange(1709)[:, None] * world + np.arange(40, 48)).reshape(-1), np.arange(128)]) % n
    for seed in (0, 2**63 - 1):
        np.testing.assert_array_equal(rp.randperm_at(n, seed, at, backend="numpy"), torch_perm(n, seed)[at])


def test_a_few_entries_of_no_or_one_file_and_bad_entries() -> None:
    assert rp.randperm_at(0, 1, []).tolist() == []
    assert rp.randperm_at(1, 1, [0, 0]).tolist() == [0, 0]
    for bad in ([-1], [5]):
        with pytest.raises(ValueError, match="entries"):
            rp.randperm_at(5, 1, bad)


def test_only_the_low_32_bits_of_the_seed_matter() -> None:
    for backend in ("numpy", "torch"):
        np.testing.assert_array_equal(
            rp.randperm(500, 5, backend=backend), rp.randperm(500, 2**32 + 5, backend=backend)
        )
    assert not np.array_equal(rp.randperm(500, 5), rp.randperm(500, 6))


def test_auto_uses_torch_here_and_agrees() -> None:
    assert rp.torch_available()
    assert rp.resolve_backend("auto") == "torch"
    np.testing.assert_array_equal(rp.randperm(1000, 7), torch_perm(1000, 7))


def test_stream_draws_are_torch_generator_draws() -> None:
    for seed in (0, 2**32 + 5, -1):
        r64 = torch_random64(seed, 500)
        draws = rp.Mt19937Stream(seed).draws(1000).astype(np.uint64)
        np.testing.assert_array_equal((draws[0::2] << np.uint64(32)) | draws[1::2], r64)


def test_int32_random_takes_one_draw_each() -> None:
    """TorchGeneratorStream.skip relies on it; int32 random_() keeps the low 31 bits of random()."""
    g = torch.Generator()
    g.manual_seed(9)
    vals = torch.empty(333, dtype=torch.int32).random_(generator=g).numpy()
    np.testing.assert_array_equal(vals, rp.Mt19937Stream(9).draws(333) % 2**31)


def test_randperm_from_stream_consumes_exactly_what_torch_consumes() -> None:
    for n in (1, 2, 1000):
        g = torch.Generator()
        g.manual_seed(3)
        stream = rp.Mt19937Stream(3)
        stream.skip(11)
        torch.empty(11, dtype=torch.int32).random_(generator=g)
        for _ in range(3):  # consecutive permutations from one generator
            np.testing.assert_array_equal(rp.randperm_from_stream(n, stream), torch.randperm(n, generator=g).numpy())
        assert stream.consumed == 11 + 3 * rp.randperm_draws(n)
        after = torch.empty(4, dtype=torch.int64).random_(-(2**63), None, generator=g).numpy().view(np.uint64)
        d = stream.draws(8).astype(np.uint64)
        np.testing.assert_array_equal((d[0::2] << np.uint64(32)) | d[1::2], after)


def test_stream_copy_is_an_independent_checkpoint() -> None:
    for stream in (rp.Mt19937Stream(4), rp.TorchGeneratorStream(4)):
        stream.skip(7)
        snap = stream.copy()
        first = stream.randperm(300)
        assert snap.consumed == 7
        np.testing.assert_array_equal(snap.randperm(300), first)
        assert snap.consumed == stream.consumed == 7 + 299


def test_torch_stream_skip_matches_numpy_stream() -> None:
    a, b = rp.Mt19937Stream(12), rp.TorchGeneratorStream(12)
    a.skip(5_000_001)
    b.skip(5_000_001)
    np.testing.assert_array_equal(a.randperm(999), b.randperm(999))


@pytest.mark.parametrize("n", [0, 1, 2, 3, 10, 257, 1000])
@pytest.mark.parametrize("seed", [0, 42, 2**32 + 5])
def test_python_transcription_of_the_32bit_loop_is_torch(n: int, seed: int) -> None:
    """The transcription style used for the 64-bit reference reproduces torch where torch can be run."""
    assert torch_loop_32(n, seed) == torch_perm(n, seed).tolist()


@pytest.mark.parametrize("n", [1, 2, 3, 10, 257, 1000, 20011])
@pytest.mark.parametrize("seed", [0, 42, 2**32 + 5, 2**63 - 1])
def test_numpy_64bit_loop_equals_torch_transcription(n: int, seed: int) -> None:
    got = rp._numpy_randperm(n, rp.Mt19937Stream(seed), sixty_four_bit=True)
    assert got.tolist() == torch_loop_64(n, seed & 0xFFFFFFFF)


def test_64bit_loop_consumes_two_draws_per_element() -> None:
    stream = rp.Mt19937Stream(1)
    rp._numpy_randperm(100, stream, sixty_four_bit=True)
    assert stream.consumed == 200
    assert rp.randperm_draws(rp.THRESHOLD_64BIT) == 2 * rp.THRESHOLD_64BIT
    assert rp.randperm_draws(rp.THRESHOLD_64BIT - 1) == rp.THRESHOLD_64BIT - 2


def test_per_size_arrays_are_cached_only_for_moderate_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Size-only constants are kept between epochs, but a huge dataset's would pin gigabytes."""
    monkeypatch.setattr(rp, "_CACHED_N", 1000)
    for table in (rp._divisors, rp._arange32, rp._step_keys):
        table._cached.cache_clear()
    np.testing.assert_array_equal(rp.randperm(5000, 8, backend="numpy"), torch_perm(5000, 8))
    assert all(t._cached.cache_info().currsize == 0 for t in (rp._divisors, rp._arange32, rp._step_keys))
    np.testing.assert_array_equal(rp.randperm(999, 8, backend="numpy"), torch_perm(999, 8))
    assert all(t._cached.cache_info().currsize == 1 for t in (rp._divisors, rp._arange32, rp._step_keys))
    assert not rp._divisors(999).flags.writeable


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_randperm_into_a_given_array(backend: rp.Backend) -> None:
    """``out`` receives exactly what randperm returns (any n, both loops), and is what comes back."""
    for n, seed in [(0, 0), (1, 3), (2, 5), (4097, 7)]:
        buf = np.full(n + 3, -1, dtype=np.int64)
        view = buf[:n]
        assert rp.randperm(n, seed, backend=backend, out=view) is view
        np.testing.assert_array_equal(buf[:n], torch_perm(n, seed))
        assert (buf[n:] == -1).all()
    n = 300
    buf = np.empty(n, dtype=np.int64)
    got = rp._numpy_randperm(n, rp.Mt19937Stream(6), sixty_four_bit=True, out=buf)
    assert got is buf and buf.tolist() == torch_loop_64(n, 6)
    for bad in (np.empty(4, np.int64), np.empty(5, np.int32)):
        with pytest.raises(ValueError, match="out"):
            rp.randperm(5, 0, backend=backend, out=bad)  # type: ignore[arg-type]  # the wrong dtype on purpose


@pytest.mark.parametrize(
    ("n", "seed", "backend"),
    [(-1, 0, "auto"), (1.5, 0, "auto"), (3, 2**64, "auto"), (3, -(2**63) - 1, "numpy"), (3, 0, "gpu")],
)
def test_bad_arguments_raise_valueerror(n: object, seed: int, backend: str) -> None:
    with pytest.raises(ValueError):
        rp.randperm(n, seed, backend=backend)  # type: ignore[arg-type]


def test_torch_refuses_the_seeds_we_refuse() -> None:
    for seed in (2**64, -(2**63) - 1):
        with pytest.raises((ValueError, RuntimeError, OverflowError)):
            torch.Generator().manual_seed(seed)


def test_without_torch_numpy_path_is_used_and_exact(tmp_path: Path) -> None:
    """A process where torch cannot be imported still gets torch's permutations."""
    cases = [(0, 0), (1, 5), (1000, 2**32 + 5), (4097, -1), (100_003, 2**63 - 1)]
    expected = {f"{n}/{s}": torch_perm(n, s).tolist() for n, s in cases}
    script = textwrap.dedent(
        f"""
        import json, sys
        sys.modules["torch"] = None  # import torch now raises ImportError
        from placement import randperm as rp
        assert not rp.torch_available()
        assert rp.resolve_backend("auto") == "numpy"
        try:
            rp.randperm(3, 0, backend="torch")
        except RuntimeError:
            pass
        else:
            raise SystemExit("backend='torch' did not fail without torch")
        out = {{f"{{n}}/{{s}}": rp.randperm(n, s).tolist() for n, s in {cases!r}}}
        json.dump(out, sys.stdout)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == expected


@pytest.mark.slow
@pytest.mark.parametrize("n", [rp.THRESHOLD_64BIT - 1, rp.THRESHOLD_64BIT])
def test_largest_small_and_smallest_large_n_equal_torch(n: int) -> None:
    """Real torch on both sides of the threshold (up to 1.5 minutes and 7 GiB each)."""
    got = rp.randperm(n, 3, backend="numpy")
    g = torch.Generator()
    g.manual_seed(3)
    want = torch.randperm(n, generator=g, dtype=torch.int32).numpy()
    step = 1 << 24
    for lo in range(0, n, step):
        np.testing.assert_array_equal(got[lo : lo + step], want[lo : lo + step])


def test_past_the_draw_chunk() -> None:
    """Draws are generated in bounded chunks: a permutation spanning two stays exact."""
    n = rp._DRAW_CHUNK + 2
    np.testing.assert_array_equal(rp.randperm(n, 2**63 - 1, backend="numpy"), torch_perm(n, 2**63 - 1))


@pytest.mark.slow
def test_int32_work_arrays_and_chunked_64bit_draws() -> None:
    """Past 2**25 files the work arrays switch to int32; the 64-bit loop spans two draw chunks."""
    n = rp._SMALL_WORK + 1
    np.testing.assert_array_equal(rp.randperm(n, 42, backend="numpy"), torch_perm(n, 42))
    n = rp._DRAW_CHUNK // 2 + 3  # two draws per element: two chunks
    got = rp._numpy_randperm(n, rp.Mt19937Stream(6), sixty_four_bit=True)
    assert got.tolist() == torch_loop_64(n, 6)
