"""The optional Prometheus endpoint (config ``metrics``): GET /metrics, generated from the status types.

Every metric comes from a status field (:mod:`fusefs.daemon.schema` derives names, types, units and
labels from the section TypedDicts), so the endpoint and ``.control/status`` cannot disagree: a
scrape is the status document rendered another way.

Concurrency rule: the HTTP server runs in its own threads (prometheus_client's threading WSGI
server, one thread per request) and never reads live daemon state.  A scrape asks the trio thread
for a snapshot (``TrioToken.run_sync_soon``); there the status document is rendered, exactly as for
a ``.control/status`` read, and deep-copied into immutable mappings and tuples
(:func:`freeze`), which the trio thread hands back through a ``concurrent.futures.Future``.  The
HTTP thread then only reads that frozen copy, its own immutable metric specs, and the trio token
(set once, before the server thread starts).  The few counters the HTTP thread keeps itself
(scrapes, failures) are guarded by ``_lock``, which the trio thread takes to show them in status.
A scrape waits at most ``snapshot_timeout`` (5 s) for the trio thread and answers 503 without one.
"""

from __future__ import annotations

import concurrent.futures
import logging
import socket
import threading
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Annotated, Any, TypedDict
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import trio
from prometheus_client.exposition import ThreadingWSGIServer, choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
)

from fusefs.cluster.formation import bind_address
from fusefs.config import MetricsConfig
from fusefs.daemon.schema import MetricSpec, Sample, metric_specs, samples
from placement.statusfields import counter, text

log = logging.getLogger(__name__)

SNAPSHOT_TIMEOUT_S = 5.0
"""How long a scrape waits for the trio thread to hand over a status snapshot."""


class MetricsStatus(TypedDict):
    """Status section ``metrics``: the Prometheus endpoint."""

    enabled: Annotated[bool, text("metrics.enabled")]
    address: Annotated[str | None, text("the address it listens on (null when off)")]
    port: Annotated[int | None, text("the port it listens on, the bound one when metrics.port is 0 (null when off)")]
    url: Annotated[str | None, text("where to scrape: http://ADDRESS:PORT/metrics (null when off)")]
    scrapes: Annotated[int, counter("scrapes answered with metrics")]
    failed_scrapes: Annotated[
        int, counter("scrapes answered 503: the daemon did not hand over a status snapshot in time, or was stopping")
    ]
    error: Annotated[str | None, text("why the endpoint does not serve (e.g. its port is taken), or null")]


def freeze(value: Any) -> Any:
    """A deep copy nobody else holds, read-only: mappings become MappingProxyType, lists tuples."""
    if isinstance(value, Mapping):
        return types.MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    return value


def families(specs: Mapping[str, MetricSpec], found: Iterable[Sample]) -> list[Metric]:
    """prometheus_client metric families holding ``found``; every spec has a family, even without samples."""
    out: dict[str, Metric] = {}
    for name, spec in specs.items():
        unit = spec.unit if spec.type in ("counter", "gauge") else ""
        labels = list(spec.labels)
        if spec.type == "counter":
            out[name] = CounterMetricFamily(name, spec.doc, labels=labels, unit=unit)
        elif spec.type == "gauge":
            out[name] = GaugeMetricFamily(name, spec.doc, labels=labels, unit=unit)
        elif spec.type == "stateset":
            out[name] = StateSetMetricFamily(name, spec.doc, labels=labels)
        else:
            out[name] = InfoMetricFamily(name, spec.doc, labels=list(spec.labels[: len(spec.labels) - len(spec.info)]))
    for s in found:
        family = out[s.metric]
        values = [v for _, v in s.labels]
        if isinstance(family, InfoMetricFamily):
            assert isinstance(s.value, dict)
            family.add_metric(values, {k: str(v) for k, v in s.value.items()})
        elif isinstance(family, StateSetMetricFamily):
            assert isinstance(s.value, dict)
            family.add_metric(values, {k: bool(v) for k, v in s.value.items()})
        else:
            assert isinstance(s.value, float)
            family.add_metric(values, s.value)  # type: ignore[attr-defined]  # Counter/Gauge families
    return list(out.values())


class _Collected:
    """What prometheus_client's encoders take: something with ``collect()``."""

    def __init__(self, found: list[Metric]) -> None:
        self._found = found

    def collect(self) -> Iterator[Metric]:
        return iter(self._found)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not worth a log line each."""


class MetricsExporter:
    """The endpoint of one mount: bound by :meth:`bind` (before the mount), served by :meth:`start`
    (from the trio thread, which hands over snapshots), stopped by :meth:`close`."""

    def __init__(self, cfg: MetricsConfig, root: Any, document: Callable[[], Mapping[str, Any]]) -> None:
        self.cfg = cfg
        self.root = root
        self.document = document  # renders the status document: call only on the trio thread
        self.specs = metric_specs(root)  # immutable from here on: the HTTP threads read it
        self._lock = threading.Lock()
        self._scrapes = 0
        self._failed = 0
        self._error: str | None = None
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self.snapshot_timeout = SNAPSHOT_TIMEOUT_S

    def bind(self) -> None:
        """Listen now, so the port is known (status) when the mount answers; a port that cannot be
        bound is a log line and a status note, never a failed mount."""
        if not self.cfg.enabled:
            return
        try:
            host = bind_address(self.cfg.bind)
            server_class = type(
                "MetricsServer",
                (ThreadingWSGIServer,),
                {"address_family": socket.AF_INET6 if ":" in host else socket.AF_INET},
            )
            self._server = make_server(host, self.cfg.port, self._app, server_class, handler_class=_QuietHandler)
        except (OSError, ValueError) as exc:
            text = getattr(exc, "strerror", None) or str(exc)
            self._error = f"cannot listen on {self.cfg.bind}:{self.cfg.port}: {text}"
            log.warning("metrics: %s; serving without metrics", self._error)

    def start(self) -> None:
        """Serve in a thread; call on the trio thread (its token is what scrapes hand work to)."""
        if self._server is None:
            return
        self._token = trio.lowlevel.current_trio_token()
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name="metrics-http", daemon=True
        )
        self._thread.start()
        log.info("metrics: serving %s", self._url())

    def close(self) -> None:
        if self._server is None:
            return
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()

    def _url(self) -> str | None:
        if self._server is None:
            return None
        host, port = str(self._server.server_address[0]), int(self._server.server_address[1])
        return f"http://[{host}]:{port}/metrics" if ":" in host else f"http://{host}:{port}/metrics"

    def status(self) -> MetricsStatus:
        addr = self._server.server_address[:2] if self._server is not None else None
        with self._lock:
            scrapes, failed = self._scrapes, self._failed
        return {
            "enabled": self.cfg.enabled,
            "address": str(addr[0]) if addr is not None else None,
            "port": int(addr[1]) if addr is not None else None,
            "url": self._url(),
            "scrapes": scrapes,
            "failed_scrapes": failed,
            "error": self._error,
        }

    # ------------------------------------------------------------------ HTTP threads

    def snapshot(self) -> Mapping[str, Any]:
        """The status document as the trio thread renders it now, frozen (see the module docstring)."""
        token = self._token
        if token is None:
            raise RuntimeError("the daemon is not serving yet")
        handed: concurrent.futures.Future[Mapping[str, Any]] = concurrent.futures.Future()

        def take() -> None:  # runs on the trio thread; must not raise (it would crash the run)
            try:
                handed.set_result(freeze(self.document()))
            except BaseException as exc:
                handed.set_exception(exc)

        token.run_sync_soon(take)  # trio.RunFinishedError once the daemon stopped serving
        return handed.result(timeout=self.snapshot_timeout)

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        if environ.get("PATH_INFO", "/") not in ("/", "/metrics"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"seerfs serves its metrics at /metrics\n"]
        try:
            doc = self.snapshot()
            found = families(self.specs, samples(self.root, doc, self.specs))
        except (concurrent.futures.TimeoutError, trio.RunFinishedError, RuntimeError) as exc:
            with self._lock:
                self._failed += 1
            start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
            return [f"seerfs: no status snapshot: {exc or 'timed out'}\n".encode()]
        encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT", ""))
        body = encoder(_Collected(found))
        with self._lock:
            self._scrapes += 1
        start_response("200 OK", [("Content-Type", content_type), ("Content-Length", str(len(body)))])
        return [body]
