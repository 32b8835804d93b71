"""The status types as the one source of the docs and the metrics: every field declared once, the
check that compares a document with them can fail, and the metrics endpoint renders its snapshot on
the trio thread and hands it over (no mount: the exporter runs in this process over a real socket).

The real mounts' documents are checked against these types in tests/test_status_metrics.py."""

from __future__ import annotations

import copy
import dataclasses
import re
import socket
import threading
import time
import types
import urllib.error
import urllib.request
from typing import Any, Literal, get_args, get_origin, get_type_hints, is_typeddict

import pytest
import trio

from fusefs.cluster.peer_client import PeerCounters, PeerCountersStatus
from fusefs.config import MetricsConfig, load
from fusefs.daemon import schema
from fusefs.daemon.metrics import MetricsExporter, freeze
from fusefs.daemon.status import StatusBoard, StatusDocument
from fusefs.errors import ConfigError
from fusefs.tiers.base import TierCounters, TierCountersStatus

METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


@pytest.mark.parametrize(
    ("counters", "status"), [(TierCounters, TierCountersStatus), (PeerCounters, PeerCountersStatus)]
)
def test_counter_dataclasses_match_the_status_types_that_document_them(counters: Any, status: Any) -> None:
    """A counter added to the dataclass without its documented line (or the reverse) fails here."""
    fields = {f.name: f.type for f in dataclasses.fields(counters)}
    documented = {f.name: f.tp for f in schema.fields_of(status)}
    assert list(fields) == list(documented)
    hints = get_type_hints(counters)
    assert {k: hints[k] for k in fields} == documented


def test_every_field_is_documented_and_every_metric_is_well_formed() -> None:
    items = list(schema.walk(StatusDocument))  # raises TypeError for a field without a Field
    assert len(items) > 200 and all(i.spec.meta.doc for i in items)
    specs = schema.metric_specs(StatusDocument)  # raises TypeError when two fields make one name differently
    exposed = [s.exposed for s in specs.values()]
    assert len(set(exposed)) == len(exposed)
    for spec in specs.values():
        assert METRIC_NAME.match(spec.exposed) and spec.exposed.startswith("seerfs_"), spec
        assert all(LABEL_NAME.match(label) for label in spec.labels), spec
        assert spec.doc, spec
        if spec.unit:
            assert spec.name.endswith("_" + spec.unit), spec
        if spec.type == "counter":
            assert not spec.name.endswith("_total"), spec
    # what the brief of the endpoint promises: units, labels, hit ratio, states, peers up/down
    assert (
        specs["seerfs_reads_source_bytes"].labels == ("source",) and specs["seerfs_reads_source_bytes"].unit == "bytes"
    )
    assert specs["seerfs_tier_hits"].labels == ("tier",) and specs["seerfs_tier_hits"].type == "counter"
    assert specs["seerfs_group_peer_bytes"].labels == ("peer",)
    assert specs["seerfs_cursor_hit_ratio"].unit == "ratio"
    assert set(specs["seerfs_group_peer_state"].states) == {"self", "up", "down"}
    assert set(specs["seerfs_plan_state"].states) == {"idle", "planning", "ready", "failed"}
    assert specs["seerfs_plan"].type == "info" and "digest" in specs["seerfs_plan"].info


def _document() -> dict[str, Any]:
    """A document as the types describe it, built from the types themselves (every field present)."""

    def value(tp: Any) -> Any:
        opts, _ = schema.options(tp)
        tp = max(opts, key=lambda o: len(schema.fields_of(o)) if is_typeddict(o) else 0)  # the fullest variant
        if is_typeddict(tp):
            return {f.name: value(f.tp) for f in schema.fields_of(tp)}
        origin = get_origin(tp)
        if origin is list:  # one item of each variant
            return [value(variant) for variant in schema.options(get_args(tp)[0])[0]]
        if origin is dict:
            keys = schema.literal_values(get_args(tp)[0]) or ("k",)
            return {k: value(get_args(tp)[1]) for k in keys}
        if origin is Literal:
            return get_args(tp)[0]
        return {bool: True, int: 1, float: 1.5, str: "x"}[tp]

    return value(StatusDocument)  # type: ignore[no-any-return]


def test_the_check_finds_undocumented_missing_and_mistyped_fields() -> None:
    """What the real-mount test relies on: each kind of drift is reported, with its path."""
    doc = _document()
    assert schema.check(doc, StatusDocument) == []
    extra = copy.deepcopy(doc)
    extra["reads"]["new_counter"] = 3
    assert schema.check(extra, StatusDocument) == ["reads.new_counter: not documented"]
    missing = copy.deepcopy(doc)
    del missing["tiers"][0]["tier_bytes"]
    assert any("tiers[0]" in e for e in schema.check(missing, StatusDocument))
    wrong = copy.deepcopy(doc)
    wrong["plan"]["state"] = "thinking"
    assert schema.check(wrong, StatusDocument) == [
        "plan.state: 'thinking', documented as one of ('idle', 'planning', 'ready', 'failed')"
    ]
    typed = copy.deepcopy(doc)
    typed["reads"]["opens"] = "12"
    assert schema.check(typed, StatusDocument) == ["reads.opens: '12', documented as integer"]
    source = copy.deepcopy(doc)
    del source["reads"]["by_source"]["peer"]
    assert schema.check(source, StatusDocument) == ["reads.by_source.peer: documented, missing"]
    assert schema.check({**doc, "extra": 1}, StatusDocument) == ["extra: not documented"]


def test_every_exported_field_of_a_full_document_gives_its_metric_a_sample() -> None:
    doc = _document()
    specs = schema.metric_specs(StatusDocument)
    found = {s.metric for s in schema.samples(StatusDocument, doc, specs)}
    assert found == set(specs)


def test_the_metrics_config_is_off_by_default_on_loopback_and_checked() -> None:
    assert load().metrics == MetricsConfig(enabled=False, bind="127.0.0.1", port=9477)
    assert load(None, {"metrics.enabled": "true", "metrics.port": "0"}).metrics.port == 0
    with pytest.raises(ConfigError, match=r"metrics\.port: expected 0\.\.65535"):
        load(None, {"metrics.port": "70000"})


def test_a_frozen_snapshot_cannot_be_changed_and_shares_nothing() -> None:
    live = {"reads": {"opens": 1, "list": [1, {"a": 2}]}}
    frozen = freeze(live)
    live["reads"]["opens"] = 2
    live["reads"]["list"][1]["a"] = 3  # type: ignore[index]
    assert frozen["reads"]["opens"] == 1 and frozen["reads"]["list"][1]["a"] == 2
    assert isinstance(frozen["reads"], types.MappingProxyType)
    with pytest.raises(TypeError):
        frozen["reads"]["opens"] = 5  # type: ignore[index]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as res:
            return res.status, res.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_scrapes_render_the_document_on_the_trio_thread_and_answer_503_without_it() -> None:
    """The concurrency rule of fusefs/daemon/metrics.py, observed: the document is rendered on the
    thread running trio (never the HTTP thread), and a scrape while that thread is blocked gets 503
    after its timeout instead of reading live state."""
    board = StatusBoard("/src", "/mnt")
    board.state = "serving"
    rendered_on: list[int] = []

    def render() -> dict[str, Any]:
        rendered_on.append(threading.get_ident())
        return dict(board())

    results: dict[str, Any] = {}

    async def main() -> None:
        exporter = MetricsExporter(MetricsConfig(enabled=True, port=0), StatusDocument, render)
        exporter.bind()
        exporter.start()
        try:
            url = exporter.status()["url"]
            assert url is not None
            results["ok"] = await trio.to_thread.run_sync(_get, url)
            results["missing"] = await trio.to_thread.run_sync(_get, url.replace("/metrics", "/other"))
            exporter.snapshot_timeout = 0.3
            blocked = threading.Thread(target=lambda: results.setdefault("blocked", _get(url)))
            blocked.start()
            time.sleep(1.0)  # the trio thread is busy: the scrape must not be answered from live state
            await trio.to_thread.run_sync(blocked.join)
            results["status"] = exporter.status()
        finally:
            exporter.close()

    trio.run(main)
    code, body = results["ok"]
    assert code == 200 and 'seerfs_state{seerfs_state="serving"} 1.0' in body
    assert 'seerfs_info{mountpoint="/mnt",source="/src",version=' in body
    assert rendered_on and set(rendered_on) == {threading.get_ident()}  # this thread ran trio.run
    assert results["missing"][0] == 404
    assert results["blocked"][0] == 503, results["blocked"]
    assert results["status"]["scrapes"] == 1 and results["status"]["failed_scrapes"] == 1


def test_a_metrics_port_in_use_is_a_status_note_not_an_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        exporter = MetricsExporter(MetricsConfig(enabled=True, port=port), StatusDocument, dict)
        exporter.bind()
    status = exporter.status()
    assert status["port"] is None and status["error"] is not None and f"127.0.0.1:{port}" in status["error"]
    assert "Address already in use" in status["error"]
