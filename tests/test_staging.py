"""Staging bookkeeping when a reader's open races the push of the same file (no mount: pushes are recorded)."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable

import trio

from fusefs.meta.ids import inode_of
from fusefs.readpath.staging import Staging
from fusefs.tiers import Budget

SIZE = 1000


class Kernel:
    """Stands in for notify_store / invalidate_inode; a push can be held mid-way to open the race."""

    def __init__(self) -> None:
        self.pushed: list[int] = []
        self.invalidated: list[int] = []
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()

    def push(self, inode: int, offset: int, data: bytes) -> None:
        self.entered.set()
        self.hold.wait(10)
        self.pushed.append(inode)

    def invalidate(self, inode: int) -> None:
        self.invalidated.append(inode)


def staging_with(kernel: Kernel) -> tuple[Staging, Budget]:
    budget = Budget(100 * SIZE, "memory")
    return Staging(budget, 50 * SIZE, "page_cache", push=kernel.push, invalidate=kernel.invalidate), budget


async def during_push(staging: Staging, kernel: Kernel, entry: int, meanwhile: Callable[[], Awaitable[None]]) -> None:
    """Stage ``entry``, run ``meanwhile`` while its push is held in flight, then let the push end."""
    assert staging.reserve(entry, SIZE)
    kernel.hold.clear()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(staging.fill, entry, b"x" * SIZE)
        await trio.to_thread.run_sync(kernel.entered.wait, 10)
        await meanwhile()
        kernel.hold.set()
    await drain(staging)


async def drain(staging: Staging) -> None:
    """Run the invalidation task until every queued drop reached the kernel (fill queues them synchronously)."""
    queued = staging._drop_send.statistics().current_buffer_used
    async with trio.open_nursery() as nursery:
        nursery.start_soon(staging.run)
        with trio.fail_after(5):
            while staging.invalidations < queued:
                await trio.sleep(0.005)
        nursery.cancel_scope.cancel()


def test_a_file_opened_and_released_during_its_push_keeps_its_pages() -> None:
    """The reader pulled the file's pages through the mount while the push was in flight; the push that
    finishes after the release must not invalidate them, and their charge moves to kept pages."""
    kernel = Kernel()
    staging, budget = staging_with(kernel)

    async def reader() -> None:
        assert staging.take(7) is None  # not usable yet: the open reads through the mount
        assert staging.note_read(7, SIZE)  # its pages are charged by the staged reservation
        staging.retire(7)  # the reader's release

    trio.run(during_push, staging, kernel, 7, reader)
    assert kernel.pushed == [inode_of(7)]
    assert kernel.invalidated == []
    assert staging.kept == {7: SIZE} and budget.used == SIZE
    assert staging.unused == 0


def test_a_file_dropped_during_its_push_loses_the_pushed_pages() -> None:
    """Control for the rule above: a staged file nobody opened, dropped with the window while its push
    was in flight, has the pushed pages invalidated and its charge released."""
    kernel = Kernel()
    staging, budget = staging_with(kernel)

    async def new_plan() -> None:
        await staging.clear()  # the window is meaningless now

    trio.run(during_push, staging, kernel, 7, new_plan)
    assert kernel.invalidated == [inode_of(7)]
    assert staging.kept == {} and budget.used == 0


def test_a_file_opened_before_its_bytes_came_is_not_pushed() -> None:
    """An open that arrived while the file was still being fetched reads it through the mount itself,
    so the fetched bytes are not pushed a second time; the release keeps the pages."""
    kernel = Kernel()
    staging, budget = staging_with(kernel)

    async def main() -> None:
        assert staging.reserve(7, SIZE)
        assert staging.take(7) is None
        await staging.fill(7, b"x" * SIZE)
        staging.retire(7)
        await drain(staging)

    trio.run(main)
    assert kernel.pushed == [] and kernel.invalidated == []
    assert staging.kept == {7: SIZE} and budget.used == SIZE
