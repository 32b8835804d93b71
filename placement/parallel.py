"""Planning's independent numpy passes, run in a pool the caller hands in (or in the calling thread).

Every node must compute the same plan, so placement reads no clock and no unseeded randomness and
starts no threads (``tests/test_layering.py``); the caller owns the threads.  Planning at ImageNet
scale is seconds of numpy passes that release the GIL: an epoch's permutation, a node's row, a range
of objects.  Running the next permutations beside the current epoch's folding saves about a third of
the access pass on two cores (``tools/bench/plan --workers 1`` shows the sequential cost), so
``fusefs.planning`` passes a :class:`Pool` (a ``concurrent.futures.ThreadPoolExecutor``) and the
width it was made for; ``None`` runs everything in the calling thread.

What keeps the result independent of the pool and the width: each helper returns its results in
input order, and the calls it runs write disjoint outputs (a node's own row, a slice of objects) or
return fresh arrays.  ``tests/test_plan.py`` checks that a plan has the same digest with and without
a pool.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from typing import Protocol, TypeVar

A = TypeVar("A")
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Task(Protocol[T_co]):
    """A call handed to a :class:`Pool` (a ``concurrent.futures.Future``)."""

    def result(self) -> T_co: ...

    def cancel(self) -> bool: ...


class Pool(Protocol):
    """Threads to run calls in, owned by the caller: ``concurrent.futures.ThreadPoolExecutor`` is one.
    Defined here so that placement imports no executor, not even for typing.  The calls given to it
    never use it themselves (a full pool would wait on itself)."""

    def map(self, fn: Callable[[A], T], iterable: Iterable[A], /) -> Iterator[T]: ...

    def submit(self, fn: Callable[[], T], /) -> Task[T]: ...


def per_node(fn: Callable[[int], T], nodes: int, pool: Pool | None = None) -> list[T]:
    """``[fn(0), ..., fn(nodes - 1)]``, in ``pool`` when given.  The nodes' rows are independent
    and the work in them is numpy passes over whole rows, which release the GIL, so a second core
    shortens it without changing a result."""
    if pool is None or nodes <= 1:
        return [fn(k) for k in range(nodes)]
    return list(pool.map(fn, range(nodes)))


def by_columns(fn: Callable[[slice], T], m: int, pool: Pool | None, parts: int) -> list[T]:
    """``fn`` over ``parts`` contiguous ranges of 0..m-1 in ``pool``, in order (one range, here,
    without a pool): for the steps that loop over nodes but treat every object alone (a running
    minimum over the nodes' rows), which :func:`per_node` cannot split."""
    parts = min(parts, m)
    if pool is None or parts <= 1:
        return [fn(slice(0, m))]
    return list(pool.map(fn, [slice(m * i // parts, m * (i + 1) // parts) for i in range(parts)]))


def run_ahead(
    inline: Sequence[Callable[[], T]], ahead: Sequence[Callable[[], T] | None], pool: Pool | None, depth: int
) -> Generator[T, None, None]:
    """``inline[i]()`` for each i in order, except that where ``ahead[i]`` is given, up to ``depth``
    of those are computed in ``pool`` before they are due and yielded in their turn instead.

    ``ahead[i]`` must give what ``inline[i]`` would, without touching state the inline calls use
    (a pure per-epoch permutation); the inline ones run here, in order, and may be stateful.  Without
    a pool or with ``depth < 1`` only the inline calls run.  Closed early, it cancels what has not
    started and waits for what has, so that no call of it outlives it: close it when leaving a loop
    over it on an error (``contextlib.closing``).
    """
    if pool is None or depth < 1:
        for call in inline:
            yield call()
        return
    tasks: dict[int, Task[T]] = {}
    upcoming = iter([i for i, call in enumerate(ahead) if call is not None])
    try:
        for i, call in enumerate(inline):
            while len(tasks) < depth:
                j = next(upcoming, None)
                if j is None:
                    break
                early = ahead[j]
                assert early is not None
                tasks[j] = pool.submit(early)
            task = tasks.pop(i, None)
            yield task.result() if task is not None else call()
    finally:
        for task in tasks.values():
            if not task.cancel():
                with contextlib.suppress(Exception):  # what ended the loop matters, not this call's error
                    task.result()
