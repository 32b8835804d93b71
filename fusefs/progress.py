"""Progress of long work (the source walk, building a plan) in one shape, and how a terminal shows it.

The thread doing the work counts into a :class:`Progress`; the status document, the readiness pipe
of ``seerfs mount`` and the start record ``seerfs wait`` reads all carry :meth:`Progress.doc`, a
plain dict whose ``line`` is rendered once here, so every command prints the same sentence.

Concurrency: :meth:`Progress.add` is called from the walker's pool threads while the reporter thread
or the trio loop calls :meth:`Progress.doc`; one lock guards every field, and ``doc`` copies them
under it, so a reader never sees a count from one moment and a phase from another.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Literal, TextIO, TypedDict

from placement.statusfields import gauge, state, text

LOG_INTERVAL_S = 10.0
"""Without a terminal (a log, a batch job's output), one progress line at most this often."""
TTY_REFRESH_S = 0.2
"""With a terminal, how often the refreshing line is redrawn."""


ProgressState = Literal["idle", "running", "done", "failed"]
Task = Literal["walk", "plan", "start"]
"""The long tasks: the source walk, building a plan, and the daemon's startup as a whole."""


class ProgressDoc(TypedDict):
    """One long task (status field ``progress``; the start record's ``progress`` too)."""

    task: Annotated[Task, text("walk, plan or start")]
    state: Annotated[ProgressState, state("idle, running, done or failed")]
    phase: Annotated[str, text("what it does now (e.g. walking, planning)")]
    detail: Annotated[str, text("e.g. the seed, or that a persisted snapshot was reused")]
    done: Annotated[int, gauge("units done; for a finished plan, its files")]
    total: Annotated[
        int | None,
        gauge(
            "units expected, when knowable (a walk expects the entries of the persisted snapshot of the "
            "same source, even a stale one); null otherwise"
        ),
    ]
    unit: Annotated[str, text("what done and total count (entries, files, steps)")]
    elapsed_s: Annotated[float, gauge("seconds since it started (until it ended)")]
    rate: Annotated[float | None, gauge("units per second, while counted as the work goes; null otherwise")]
    eta_s: Annotated[
        float | None,
        gauge(
            "seconds left, when knowable: from total and rate, or for a plan from the last plan built "
            "for this mountpoint, scaled by files; null otherwise"
        ),
    ]
    line: Annotated[str, text("the sentence seerfs mount, seerfs wait and seerfs status print")]


def _count(n: float) -> str:
    return f"{n:,.0f}"


def _seconds(s: float) -> str:
    if s < 10:
        return f"{s:.1f} s"
    if s < 120:
        return f"{s:.0f} s"
    return f"{s // 60:.0f} min {s % 60:02.0f} s"


class Progress:
    """One long task: a phase, a count of ``unit`` done, and what is expected when that is knowable.

    ``total`` is an expected count (e.g. the previous snapshot's entries), ``expected_s`` an
    expected duration (e.g. the previous plan's build time); either gives a remaining time.
    """

    def __init__(self, task: Task, unit: str) -> None:
        self.task = task
        self.unit = unit
        self._lock = threading.Lock()
        self.state: ProgressState = "idle"
        self.phase = ""
        self.detail = ""
        self.done = 0
        self.counted = False  # done was counted as the work went (a rate means something)
        self.total: int | None = None
        self.expected_s: float | None = None
        self.started = 0.0
        self.ended: float | None = None

    def start(self, phase: str, total: int | None = None, expected_s: float | None = None, detail: str = "") -> None:
        with self._lock:
            self.state, self.phase, self.detail = "running", phase, detail
            self.done, self.counted, self.total, self.expected_s = 0, False, total, expected_s
            self.started, self.ended = time.monotonic(), None

    def set_phase(self, phase: str, detail: str | None = None) -> None:
        with self._lock:
            self.phase = phase
            if detail is not None:
                self.detail = detail

    def expect(self, seconds: float) -> None:
        """The whole task is expected to take ``seconds`` (known only once it has begun)."""
        with self._lock:
            self.expected_s = seconds

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n
            self.counted = True

    def finish(self, state: ProgressState = "done", done: int | None = None, detail: str | None = None) -> None:
        with self._lock:
            if not self.started:
                self.started = time.monotonic()
            self.state, self.phase, self.ended = state, state, time.monotonic()
            if done is not None:
                self.done = done
            if detail is not None:
                self.detail = detail

    def doc(self) -> ProgressDoc:
        """The JSON-able view (status field ``progress``, seerfs-control(7))."""
        with self._lock:
            now = self.ended if self.ended is not None else time.monotonic()
            elapsed = max(0.0, now - self.started) if self.started else 0.0
            rate = round(self.done / elapsed, 1) if elapsed > 0 and self.counted and self.done else None
            eta: float | None = None
            if self.state == "running":
                if self.total is not None and rate and self.done < self.total:
                    eta = round((self.total - self.done) / rate, 1)
                elif self.expected_s is not None:
                    eta = round(max(0.0, self.expected_s - elapsed), 1)
            doc: ProgressDoc = {
                "task": self.task,
                "state": self.state,
                "phase": self.phase,
                "detail": self.detail,
                "done": self.done,
                "total": self.total,
                "unit": self.unit,
                "elapsed_s": round(elapsed, 3),
                "rate": rate,
                "eta_s": eta,
                "line": "",
            }
        doc["line"] = describe(doc)
        return doc


def describe(doc: Mapping[str, Any]) -> str:
    """One line a person reads: what runs, how far, how fast, how long is left (when knowable)."""
    task, unit, done = doc.get("task", "?"), doc.get("unit", ""), doc.get("done", 0)
    detail = f" ({doc['detail']})" if doc.get("detail") else ""
    state = doc.get("state")
    if state == "idle":
        return f"{task}: not started"
    if state in ("done", "failed"):
        head = f"{task} {state}{detail}"
        if done:
            head += f": {_count(done)} {unit}"
        head += f" in {_seconds(doc.get('elapsed_s') or 0.0)}"
        if doc.get("rate") and done:
            head += f" ({_count(doc['rate'])} {unit}/s)"
        return head
    parts = [f"{task}: {doc.get('phase', '')}{detail}"]
    total = doc.get("total")
    if done or total:
        count = f"{_count(done)} {unit}" if total is None else f"{_count(done)} of ~{_count(total)} {unit}"
        parts.append(count)
    if doc.get("rate"):
        parts.append(f"{_count(doc['rate'])} {unit}/s")
    parts.append(f"{_seconds(doc.get('elapsed_s') or 0.0)} so far")
    if doc.get("eta_s") is not None:
        parts.append(f"~{_seconds(doc['eta_s'])} left")
    elif total is not None and done >= total:
        parts.append(f"more {unit} than last time")
    return ", ".join(parts)


def current_line(tasks: Mapping[Any, Any]) -> str:
    """The line of the task under way among ``tasks`` (name -> :meth:`Progress.doc`, or the same read
    back from JSON, hence unchecked): the last one running, else the last one listed."""
    docs = [d for d in tasks.values() if isinstance(d, dict)]
    running = [d for d in docs if d.get("state") == "running"]
    return str((running or docs or [{"line": ""}])[-1].get("line", ""))


class ProgressPrinter:
    """Shows progress lines on ``stream``: one refreshing line on a terminal, else a line every 10 s.

    The first line without a terminal comes only after 10 s, so short waits in scripts and logs
    print nothing at all.
    """

    def __init__(self, stream: TextIO, interval: float = LOG_INTERVAL_S, tty: bool | None = None) -> None:
        self.stream = stream
        self.interval = interval
        self.tty = stream.isatty() if tty is None else tty
        self.began = time.monotonic()
        self.last = self.began if not self.tty else 0.0
        self.shown = False
        self.latest = ""

    def show(self, line: str) -> None:
        self.latest = line
        now = time.monotonic()
        if self.tty:
            if now - self.last < TTY_REFRESH_S:
                return
            width = max(20, shutil.get_terminal_size((100, 24)).columns - 1)
            self.stream.write("\r" + line[:width] + "\033[K")
        else:
            if now - self.last < self.interval:
                return
            self.stream.write(line + "\n")
        self.stream.flush()
        self.last = now
        self.shown = True

    def close(self) -> None:
        """Erase the refreshing line, so what follows starts on a clean line."""
        if self.tty and self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
        self.shown = False


@contextlib.contextmanager
def shown(progress: Progress, stream: TextIO, tty: bool | None = None) -> Iterator[ProgressPrinter]:
    """Show ``progress`` on ``stream`` from a thread while the block does the work (``seerfs plan``'s walk)."""
    printer = ProgressPrinter(stream, tty=tty)
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(TTY_REFRESH_S):
            printer.show(progress.doc()["line"])

    thread = threading.Thread(target=run, name="progress", daemon=True)
    thread.start()
    try:
        yield printer
    finally:
        stop.set()
        thread.join()
        printer.close()
