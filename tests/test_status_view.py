"""`seerfs status` text: the lines a user reads to see where the mount's memory went."""

from __future__ import annotations

from fusefs.cli.status_view import render


def test_page_cache_line_shows_kept_pushed_and_dropped_pages() -> None:
    """Dropped pages are files readers will pull through FUSE again; the line must show them."""
    doc = {
        "version": "x",
        "prefetch": {
            "staging": {
                "page_cache_bytes": 3 << 20,
                "kept_files": 12,
                "pushes": 40,
                "invalidations": 5,
                "uncached_opens": 2,
            },
        },
    }
    line = next(x for x in render(doc).splitlines() if x.startswith("pagecache"))
    assert line == "pagecache 3.0 MiB held, 12 files kept, 40 pushed, 5 dropped, 2 opens uncached (budget full)"


def test_no_page_cache_line_without_staging() -> None:
    assert not any(x.startswith("pagecache") for x in render({"version": "x"}).splitlines())
