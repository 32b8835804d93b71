"""How a status field is declared: ``name: Annotated[T, counter("doc")]`` in a section's TypedDict.

A section of the ``.control/status`` document is a TypedDict defined next to the ``status()`` that
fills it; every field carries one :class:`Field` with its one-line doc, and for numbers what kind of
value it is.  That one declaration is the only source for seerfs-control(7) (``tools/genman``), for
the Prometheus metrics (``fusefs.daemon.metrics``: a counter becomes ``..._total``, a state a
state set, an info field a label of the section's ``..._info``) and for the test that a real mount's
document has exactly the documented fields.  It lives here, in the lowest layer, because the
cursor's section is declared in ``placement.cursor``, which must not import ``fusefs``.

Units: a field named ``*_bytes``/``bytes`` is in bytes, ``*_seconds``/``seconds``/``*_s`` in seconds;
any other unit is given with ``unit=``.  Timestamps are seconds since the epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["counter", "gauge", "state", "info", "text"]
"""counter: only grows while the daemon lives; gauge: goes up and down (booleans are 0/1); state: a
``Literal`` of runtime states; info: a string worth a label; text: documented, not a metric."""

Unit = Literal["", "bytes", "seconds", "ratio"]


@dataclass(frozen=True)
class Field:
    """What one status field means.

    ``metric``: the name this field adds to its metric names instead of its own ("" adds nothing).
    ``label``: for a ``dict`` or ``list`` field, the metric label that tells its items apart (a dict's
    keys, or a list item's ``key`` field); a container without one is documented but not exported.
    ``export``: False keeps a field and what it contains out of the metrics (a copy of another
    section, a list without a bounded label).
    """

    doc: str
    kind: Kind = "text"
    unit: Unit = ""
    metric: str | None = None
    label: str = ""
    key: str = ""
    export: bool = True


def text(doc: str, *, export: bool = True, label: str = "", key: str = "", metric: str | None = None) -> Field:
    """A documented field that is not a number (or a section, list or mapping of them)."""
    return Field(doc, "text", export=export, label=label, key=key, metric=metric)


def counter(doc: str, *, unit: Unit = "", metric: str | None = None, label: str = "") -> Field:
    """A number that only grows while the daemon lives (``_total`` in Prometheus)."""
    return Field(doc, "counter", unit, metric, label)


def gauge(doc: str, *, unit: Unit = "", metric: str | None = None, label: str = "") -> Field:
    """A number (or a boolean, 0/1) that goes up and down."""
    return Field(doc, "gauge", unit, metric, label)


def state(doc: str, *, metric: str | None = None) -> Field:
    """One of the values of its ``Literal`` type (a Prometheus state set: 1 for the current one)."""
    return Field(doc, "state", metric=metric)


def info(doc: str) -> Field:
    """A string (or number shown as one) exported as a label of its section's ``..._info`` metric."""
    return Field(doc, "info")
