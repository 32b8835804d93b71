"""Reading the status types: their fields, a check of a document against them, and the metrics.

The status sections are TypedDicts whose fields are ``Annotated[T, Field]`` (:mod:`placement.statusfields`).
From the root type (:class:`fusefs.daemon.status.StatusDocument`) this module derives

* :func:`fields_of` / :func:`walk`: every documented field with its dotted path (seerfs-control(7));
* :func:`check`: what in a document is undocumented, missing or of the wrong type (the tests);
* :func:`metric_specs` and :func:`samples`: the Prometheus metrics, their names and types, and the
  values a document gives them (``fusefs.daemon.metrics`` serves them).

Metric names: ``seerfs_`` then the path of the field (a field's ``metric`` replaces its own name), the
unit (``_bytes``, ``_seconds``, ``_ratio``) when the name does not end with it, and ``_total`` for
counters.  A list or mapping field with a ``label`` becomes that label on everything inside it; a
state field is a state set; the info fields of one section are the labels of its ``..._info``.
Pure functions of types and documents: no I/O, safe on any thread.
"""

from __future__ import annotations

import types
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints, is_typeddict

from placement.statusfields import Field, Kind, Unit

NoneType = type(None)
PREFIX = "seerfs"


@dataclass(frozen=True)
class FieldSpec:
    name: str
    tp: Any  # the annotation without Annotated
    meta: Field


def _strip(tp: Any) -> tuple[Any, Field | None]:
    if get_origin(tp) is Annotated:
        args = get_args(tp)
        meta = next((m for m in args[1:] if isinstance(m, Field)), None)
        return args[0], meta
    return tp, None


def fields_of(td: Any) -> list[FieldSpec]:
    """A TypedDict's fields in declaration order (bases first); each must carry a :class:`Field`."""
    out = []
    for name, hint in get_type_hints(td, include_extras=True).items():
        tp, meta = _strip(hint)
        if meta is None:
            raise TypeError(f"{td.__name__}.{name} has no doc: annotate it Annotated[T, text(...)/counter(...)/...]")
        out.append(FieldSpec(name, tp, meta))
    return out


def is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def options(tp: Any) -> tuple[list[Any], bool]:
    """The non-null alternatives of ``tp`` and whether null is allowed."""
    if is_union(tp):
        args = get_args(tp)
        return [a for a in args if a is not NoneType], NoneType in args
    return [tp], False


def sections_in(tp: Any) -> list[Any]:
    """The TypedDicts ``tp`` holds directly (itself, an optional one, the variants of a union)."""
    return [o for o in options(tp)[0] if is_typeddict(o)]


def literal_values(tp: Any) -> tuple[Any, ...]:
    return get_args(tp) if get_origin(tp) is Literal else ()


def merged_fields(variants: Sequence[Any]) -> dict[str, FieldSpec]:
    """The fields of several TypedDict variants, first declaration of each name winning."""
    out: dict[str, FieldSpec] = {}
    for v in variants:
        for f in fields_of(v):
            out.setdefault(f.name, f)
    return out


# --------------------------------------------------------------------------- walking (docs)


@dataclass(frozen=True)
class Documented:
    """One field as the man page shows it."""

    path: str  # e.g. "tiers[].journal.records", "reads.by_source.SOURCE.files"
    spec: FieldSpec
    variant: str  # the docstring of the union variant that adds it, or of its parent's ("" for all)
    depth: int


def walk(td: Any, path: str = "", done: set[Any] | None = None) -> Iterator[Documented]:
    """Every field under TypedDict ``td``, depth first.  A section is expanded where it first appears
    (``done`` collects them, across calls too); elsewhere its field's doc says what it is."""
    done = set() if done is None else done
    done.add(td)
    for f in fields_of(td):
        yield from _walk_field(f, f"{path}{f.name}", "", 0, done)


def _walk_field(f: FieldSpec, path: str, variant: str, depth: int, done: set[Any]) -> Iterator[Documented]:
    yield Documented(path, f, variant, depth)
    inner, key_word = _container(f.tp)
    sections = sections_in(inner)
    if not sections or any(s in done for s in sections):
        return
    done.update(sections)
    suffix = {"list": "[]", "dict": f".{(f.meta.label or 'KEY').upper()}", "": ""}[key_word]
    everywhere = set.intersection(*({(g.name, g.meta.doc) for g in fields_of(v)} for v in sections))
    shown: set[tuple[str, str]] = set()
    for section in sections:
        for sub in fields_of(section):
            key = (sub.name, sub.meta.doc)
            if key in shown:
                continue
            shown.add(key)
            note = variant if key in everywhere else " ".join((section.__doc__ or "").split())
            yield from _walk_field(sub, f"{path}{suffix}.{sub.name}", note, depth + 1, done)


def _container(tp: Any) -> tuple[Any, Literal["list", "dict", ""]]:
    """What a field holds: (the item type, "list"/"dict") for collections, else (the type, "")."""
    opts, _ = options(tp)
    if len(opts) == 1:
        origin = get_origin(opts[0])
        if origin is list:
            return get_args(opts[0])[0], "list"
        if origin is dict:
            return get_args(opts[0])[1], "dict"
    return tp, ""


def type_text(tp: Any) -> str:
    """A short type name for the man page."""
    opts, nullable = options(tp)
    parts = []
    for o in opts:
        origin = get_origin(o)
        if origin is Literal:
            parts.append("|".join(str(v) for v in get_args(o)))
        elif origin is list:
            parts.append(f"list of {type_text(get_args(o)[0])}")
        elif origin is dict:
            keys = literal_values(get_args(o)[0])
            what = f"keys {', '.join(map(str, keys))}" if keys else "any keys"
            parts.append(f"object ({what}) of {type_text(get_args(o)[1])}")
        elif is_typeddict(o):
            parts.append("object")
        else:
            parts.append({int: "integer", float: "number", str: "string", bool: "boolean"}.get(o, str(o)))
    text = " or ".join(dict.fromkeys(parts))
    return f"{text} or null" if nullable else text


# --------------------------------------------------------------------------- checking a document


def check(value: Any, tp: Any, path: str = "") -> list[str]:
    """Everything in ``value`` that ``tp`` does not document, everything documented that is missing,
    and every value of another type than documented; empty when the document matches exactly."""
    tp, _ = _strip(tp)
    where = path or "the document"
    if is_union(tp):
        opts, nullable = options(tp)
        if value is None:
            return [] if nullable else [f"{where}: null, documented as {type_text(tp)}"]
        results = [check(value, o, path) for o in opts]
        return [] if any(not r for r in results) else min(results, key=len)
    if tp is NoneType:
        return [] if value is None else [f"{where}: {value!r}, documented as null"]
    if is_typeddict(tp):
        if not isinstance(value, Mapping):
            return [f"{where}: {type(value).__name__}, documented as an object"]
        fields = {f.name: f for f in fields_of(tp)}
        errors = [f"{path}.{k}: not documented" if path else f"{k}: not documented" for k in value if k not in fields]
        for name, f in fields.items():
            sub = f"{path}.{name}" if path else name
            if name not in value:
                errors.append(f"{sub}: documented, missing")
            else:
                errors += check(value[name], f.tp, sub)
        return errors
    origin = get_origin(tp)
    if origin is list:
        if not isinstance(value, Sequence) or isinstance(value, str):
            return [f"{where}: {type(value).__name__}, documented as a list"]
        (item,) = get_args(tp)
        return [e for i, v in enumerate(value) for e in check(v, item, f"{path}[{i}]")]
    if origin is dict:
        if not isinstance(value, Mapping):
            return [f"{where}: {type(value).__name__}, documented as an object"]
        key_tp, item = get_args(tp)
        errors = []
        keys = literal_values(key_tp)
        if keys:
            errors += [f"{path}.{k}: not documented" for k in value if k not in keys]
            errors += [f"{path}.{k}: documented, missing" for k in keys if k not in value]
        errors += [f"{path}: key {k!r} is not a string" for k in value if not isinstance(k, str)]
        return errors + [e for k, v in value.items() for e in check(v, item, f"{path}.{k}")]
    if origin is Literal:
        return [] if value in get_args(tp) else [f"{where}: {value!r}, documented as one of {get_args(tp)}"]
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif tp is str:
        ok = isinstance(value, str)
    else:
        return [f"{where}: documented with a type this check does not know: {tp!r}"]
    return [] if ok else [f"{where}: {value!r}, documented as {type_text(tp)}"]


# --------------------------------------------------------------------------- metrics


MetricType = Literal["counter", "gauge", "stateset", "info"]


@dataclass
class MetricSpec:
    """One metric family: what Prometheus shows, and the status fields it mirrors."""

    name: str  # without _total (counters) or _info (info)
    type: MetricType
    unit: Unit
    doc: str
    labels: tuple[str, ...]  # the containers' labels, then (info) the section's info fields
    path: str  # the status field(s) it mirrors
    states: tuple[str, ...] = ()  # a state set's states
    info: tuple[str, ...] = ()  # an info's own labels (its section's info fields), after the containers'
    variants: set[str] = field(default_factory=set)  # what made it (for a consistency check)

    @property
    def exposed(self) -> str:
        """The sample name in the Prometheus text format."""
        return {"counter": f"{self.name}_total", "info": f"{self.name}_info"}.get(self.type, self.name)


def infer_unit(name: str, meta: Field) -> Unit:
    if meta.unit:
        return meta.unit
    if name == "bytes" or name.endswith("_bytes"):
        return "bytes"
    if name == "seconds" or name.endswith("_seconds") or (name.endswith("_s") and not name.endswith("_per_s")):
        return "seconds"
    return ""


def metric_name(segments: Sequence[str], name: str, meta: Field) -> str:
    """``seerfs_<segments>_<field>`` with the unit when the name lacks it (``_s`` becomes ``_seconds``)."""
    own = name if meta.metric is None else meta.metric
    unit = infer_unit(name, meta)
    if unit == "seconds" and own.endswith("_s"):
        own = own[:-2]
    base = "_".join(s for s in (PREFIX, *segments, own) if s)
    if unit and not base.endswith("_" + unit):
        base += "_" + unit
    return base


def _segment(f: FieldSpec) -> str:
    return f.name if f.meta.metric is None else f.meta.metric


_KIND_TYPE: dict[Kind, MetricType] = {"counter": "counter", "gauge": "gauge", "state": "stateset"}


def metric_specs(root: Any) -> dict[str, MetricSpec]:
    """Every metric family the document type ``root`` defines, by name (a clash is a TypeError)."""
    specs: dict[str, MetricSpec] = {}
    _spec_section([root], (), (), "", specs)
    return specs


def _add(specs: dict[str, MetricSpec], spec: MetricSpec) -> None:
    old = specs.get(spec.name)
    if old is None:
        specs[spec.name] = spec
        return
    if (old.type, old.unit, old.labels) != (spec.type, spec.unit, spec.labels) or old.path != spec.path:
        raise TypeError(f"metric {spec.name} is made by {old.path} and {spec.path} differently")
    old.states = tuple(dict.fromkeys(old.states + spec.states))


def _spec_section(
    variants: Sequence[Any], segments: tuple[str, ...], labels: tuple[str, ...], path: str, specs: dict[str, MetricSpec]
) -> None:
    infos = [f for f in merged_fields(variants).values() if f.meta.kind == "info"]
    if infos:
        name = "_".join((PREFIX, *segments))
        doc = "; ".join(f"{f.name}: {f.meta.doc}" for f in infos)
        where = f"{path}{{{','.join(f.name for f in infos)}}}" if path else ",".join(f.name for f in infos)
        own = tuple(f.name for f in infos)
        _add(specs, MetricSpec(name, "info", "", doc, labels + own, where, info=own))
    for f in (f for v in variants for f in fields_of(v)):
        if not f.meta.export or f.meta.kind == "info":
            continue
        sub = f"{path}.{f.name}" if path else f.name
        inner, container = _container(f.tp)
        sections = sections_in(inner)
        if sections:
            if container and not f.meta.label:
                continue  # a list or mapping without a label: documented, not exported
            extra = (f.meta.label,) if container else ()
            mark = {"list": "[]", "dict": f".{f.meta.label.upper()}", "": ""}[container]
            segs = (*segments, _segment(f)) if _segment(f) else segments
            _spec_section(sections, segs, labels + extra, sub + mark, specs)
            continue
        metric_type = _KIND_TYPE.get(f.meta.kind)
        if metric_type is None:
            continue
        keyed: tuple[str, ...] = ()
        if container == "dict":
            if not f.meta.label:
                continue
            keyed = (f.meta.label,)
            sub += f".{f.meta.label.upper()}"
        elif container == "list":
            continue
        states: tuple[str, ...] = ()
        if metric_type == "stateset":
            states = tuple(str(v) for o in options(inner)[0] for v in literal_values(o))
            if not states:
                raise TypeError(f"{sub} is a state field but its type {inner!r} is no Literal")
        name = metric_name(segments, f.name, f.meta)
        unit = infer_unit(f.name, f.meta) if metric_type != "stateset" else ""
        _add(specs, MetricSpec(name, metric_type, unit, f.meta.doc, labels + keyed, sub, states))


@dataclass(frozen=True)
class Sample:
    """One value a document gives a metric."""

    metric: str  # the family's name
    labels: tuple[tuple[str, str], ...]
    value: float | dict[str, bool] | dict[str, str]  # number; a state set's states; an info's labels
    path: str  # the status field it mirrors, with indices


def samples(root: Any, doc: Mapping[str, Any], specs: Mapping[str, MetricSpec] | None = None) -> Iterator[Sample]:
    """The samples document ``doc`` (of type ``root``) gives the metrics of :func:`metric_specs`."""
    yield from _sample_section([root], doc, (), (), "", specs if specs is not None else metric_specs(root))


def _sample_section(
    variants: Sequence[Any],
    value: Mapping[str, Any],
    segments: tuple[str, ...],
    labels: tuple[tuple[str, str], ...],
    path: str,
    specs: Mapping[str, MetricSpec],
) -> Iterator[Sample]:
    fields = merged_fields(variants)
    infos = [f for f in fields.values() if f.meta.kind == "info"]
    if infos:
        shown = {f.name: "" if value.get(f.name) is None else str(value.get(f.name)) for f in infos}
        yield Sample("_".join((PREFIX, *segments)), labels, shown, path or "(root)")
    for f in fields.values():
        if not f.meta.export or f.meta.kind == "info" or f.name not in value:
            continue
        v = value[f.name]
        sub = f"{path}.{f.name}" if path else f.name
        if v is None:
            continue
        inner, container = _container(f.tp)
        sections = sections_in(inner)
        segs = (*segments, _segment(f)) if _segment(f) else segments
        if sections:
            if container == "list" and f.meta.label:
                for i, item in enumerate(v):
                    key = (f.meta.label, str(item.get(f.meta.key, i)))
                    yield from _sample_section(sections, item, segs, (*labels, key), f"{sub}[{i}]", specs)
            elif container == "dict" and f.meta.label:
                for k, item in v.items():
                    yield from _sample_section(
                        sections, item, segs, (*labels, (f.meta.label, str(k))), f"{sub}.{k}", specs
                    )
            elif not container:
                yield from _sample_section(sections, v, segs, labels, sub, specs)
            continue
        if f.meta.kind not in _KIND_TYPE:
            continue
        name = metric_name(segments, f.name, f.meta)
        if container == "dict" and f.meta.label:
            for k, item in v.items():
                yield Sample(name, (*labels, (f.meta.label, str(k))), float(item), f"{sub}.{k}")
        elif container:
            continue
        elif f.meta.kind == "state":
            yield Sample(name, labels, {s: s == str(v) for s in specs[name].states}, sub)
        else:
            yield Sample(name, labels, float(v), sub)
