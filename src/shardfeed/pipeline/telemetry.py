"""Live telemetry: the numbers ``stats()`` has, served to Prometheus or OpenTelemetry.

Nothing is recorded for the exporters: at each scrape (Prometheus) or collection
(OpenTelemetry) they read ``source.stats()`` of what they watch, a :class:`Dataset` (its
latest pass, so one exporter follows every epoch) or a :class:`PipelineIterator` (that
pass). So they cost the pipeline nothing between scrapes. Per-pass numbers start again at
each new pass of a dataset: counters then go back to zero, which Prometheus' ``rate()`` and
OpenTelemetry backends read as a counter reset.

Both are functions rather than methods of ``Dataset``: one server watches several
pipelines (``server.add(eval_ds, name="eval")``) and outlives any one pass. Both client
libraries are optional and imported on first use (``pip install 'shardfeed[prometheus]'``,
``'shardfeed[otel]'``).

Metrics (Prometheus names; OpenTelemetry uses the same with dots, ``shardfeed.stage.elements``),
each labelled ``pipeline`` (the ``name`` given), per-stage ones also ``stage`` (``0:tfrecord``):

======================================================  =========  =====================================
``shardfeed_consumer_elements_total``                   counter    elements the consumer took
``shardfeed_elements_per_second``                       gauge      of them, per second of the pass
``shardfeed_consumer_wait_seconds_total``               counter    time the consumer spent in ``next``
``shardfeed_consumer_wait_fraction``                    gauge      that over the pass's wall time
``shardfeed_consumer_cpu_fraction``                     gauge      consumer CPU over wall outside ``next``
``shardfeed_consumer_waits``                            histogram  waits of at least 0.1 ms, seconds
``shardfeed_input_bound``                               gauge      1 when input-bound, else 0
``shardfeed_remedy_expected_gain`` (label ``remedy``)   gauge      the verdict's fix and its gain
``shardfeed_stage_elements_total``                      counter    elements a stage delivered
``shardfeed_stage_elements_per_second``                 gauge      of them, per second of the pass
``shardfeed_stage_bytes_total``                         counter    bytes a stage delivered
``shardfeed_stage_busy_seconds_total``                  counter    a stage's busy time (all workers)
``shardfeed_stage_parallelism``                         gauge      its workers
``shardfeed_stage_queue_fill_fraction``                 gauge      mean fill of its queue (prefetch)
``shardfeed_storage_read_bytes_total``                  counter    bytes fetched from remote storage
``shardfeed_storage_requests_total``                    counter    ranged GETs (each attempt)
``shardfeed_storage_stat_requests_total``               counter    HEAD requests and listing pages
``shardfeed_storage_put_requests_total``                counter    objects written (index files)
``shardfeed_storage_retries_total``                     counter    attempts tried again
``shardfeed_storage_cache_hits_total`` / ``_misses``    counter    local cache hits, downloads
``shardfeed_storage_request_latency_seconds``           histogram  each GET or HEAD attempt
``shardfeed_skipped_total``                             counter    errors ``on_error`` skipped
======================================================  =========  =====================================

OpenTelemetry has no asynchronous histogram: a histogram goes out as an observable counter
``<name>.bucket`` with a cumulative count per ``le`` attribute (as Prometheus' buckets, the
last ``le="+Inf"``), and counters ``<name>.sum`` and ``<name>.count``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..storage.counters import LATENCY_BOUNDS_S
from .remedy import INPUT_BOUND_WAIT_FRACTION
from .stats import WAIT_BOUNDS_S, PipelineStats

logger = logging.getLogger(__name__)


class HasStats(Protocol):
    def stats(self) -> PipelineStats: ...


@dataclass
class Metric:
    """One metric at one moment: ``kind`` is ``counter``, ``gauge`` or ``histogram``;
    ``samples`` are ``(labels, value)``, a histogram's value ``(bucket counts, sum)`` with
    counts per bound of ``bounds`` (not cumulative; one more for the rest)."""

    name: str
    kind: str
    help: str
    unit: str = ""
    bounds: tuple[float, ...] = ()
    samples: list[tuple[dict[str, str], Any]] = field(default_factory=list)


def collect(sources: dict[str, HasStats]) -> list[Metric]:
    """The metrics of every watched source, read from its ``stats()`` now."""
    m: dict[str, Metric] = {}

    def add(name: str, kind: str, help_: str, labels: dict[str, str], value: Any, unit: str = "",
            bounds: tuple[float, ...] = ()) -> None:
        metric = m.get(name)
        if metric is None:
            metric = m[name] = Metric(name, kind, help_, unit, bounds)
        metric.samples.append((labels, value))

    for pipeline, source in list(sources.items()):
        st = source.stats()
        lp = {"pipeline": pipeline}
        wall = st.wall_s
        add("shardfeed_consumer_elements", "counter", "Elements the consumer took this pass", lp,
            st.consumer_elements)
        add("shardfeed_elements_per_second", "gauge", "Elements the consumer took per second of the pass", lp,
            st.consumer_elements / wall if wall > 0 else 0.0, "1/s")
        add("shardfeed_consumer_wait_seconds", "counter", "Time the consumer spent waiting in next()", lp,
            st.consumer_wait_s, "s")
        add("shardfeed_consumer_wait_fraction", "gauge", "Consumer wait over the pass's wall time", lp,
            st.wait_fraction)
        cpu = st.consumer_cpu_fraction
        if cpu is not None:
            add("shardfeed_consumer_cpu_fraction", "gauge", "Consumer thread CPU over wall time outside next()",
                lp, cpu)
        add("shardfeed_consumer_waits", "histogram", "Consumer waits in next() of at least 0.1 ms", lp,
            (list(st.waits), st.waits_sum_s), "s", WAIT_BOUNDS_S)
        add("shardfeed_input_bound", "gauge", "1 when the consumer waited at least 10% of the pass", lp,
            1.0 if st.started is not None and st.wait_fraction >= INPUT_BOUND_WAIT_FRACTION else 0.0)
        fix = st.remedy()
        add("shardfeed_remedy_expected_gain", "gauge", "The verdict's fix and its expected gain on elements/s",
            {**lp, "remedy": fix.id}, fix.expected_gain)
        for s in list(st.stages):
            ls = {**lp, "stage": s.name}
            add("shardfeed_stage_elements", "counter", "Elements a stage delivered", ls, s.elements)
            add("shardfeed_stage_elements_per_second", "gauge", "Elements a stage delivered per second of the pass",
                ls, s.elements / wall if wall > 0 else 0.0, "1/s")
            add("shardfeed_stage_bytes", "counter", "Bytes a stage delivered", ls, s.bytes, "By")
            add("shardfeed_stage_busy_seconds", "counter", "A stage's busy time, all workers", ls, s.busy_s, "s")
            add("shardfeed_stage_parallelism", "gauge", "A stage's workers", ls, s.parallelism)
            fill = s.fraction_of_queue_full
            if fill is not None:
                add("shardfeed_stage_queue_fill_fraction", "gauge", "Mean fill of a stage's queue", ls, fill)
        io = st.storage
        for name, attr, help_, unit in (
                ("shardfeed_storage_read_bytes", "bytes_fetched", "Bytes fetched from remote storage", "By"),
                ("shardfeed_storage_requests", "requests", "Ranged GET requests, each attempt", ""),
                ("shardfeed_storage_stat_requests", "stat_requests", "HEAD requests and listing pages", ""),
                ("shardfeed_storage_put_requests", "put_requests", "Objects written (index files)", ""),
                ("shardfeed_storage_retries", "retries", "Storage attempts tried again", ""),
                ("shardfeed_storage_cache_hits", "cache_hits", "Objects found in the local cache", ""),
                ("shardfeed_storage_cache_misses", "cache_misses", "Objects downloaded to the local cache", "")):
            add(name, "counter", help_, lp, getattr(io, attr), unit)
        add("shardfeed_storage_request_latency_seconds", "histogram", "Latency of each storage GET or HEAD attempt",
            lp, (list(io.latency), io.latency_sum_s), "s", LATENCY_BOUNDS_S)
        add("shardfeed_skipped", "counter", "Errors the on_error policy skipped", lp, st.errors.total)
    return list(m.values())


def _cumulative(counts: list[int], bounds: tuple[float, ...]) -> list[tuple[str, int]]:
    out, acc = [], 0
    for bound, c in zip([*bounds, float("inf")], counts):
        acc += c
        out.append(("+Inf" if bound == float("inf") else repr(float(bound)), acc))
    return out


class _Watched:
    """The sources one exporter watches, by pipeline name."""

    def __init__(self, source: HasStats, name: str) -> None:
        self._lock = threading.Lock()
        self.sources: dict[str, HasStats] = {}
        self.add(source, name)

    def add(self, source: HasStats, name: str = "default") -> None:
        """Watch ``source`` (a ``Dataset`` or ``PipelineIterator``) too, labelled ``pipeline=name``."""
        if not callable(getattr(source, "stats", None)):
            raise TypeError(f"telemetry needs a Dataset or PipelineIterator (something with stats()), got "
                            f"{type(source).__name__}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string (the pipeline label), got {name!r}")
        with self._lock:
            if name in self.sources:
                raise ValueError(f"a pipeline named {name!r} is watched already; give this one another name")
            self.sources = {**self.sources, name: source}

    def snapshot(self) -> list[Metric]:
        return collect(self.sources)


class MetricsServer(_Watched):
    """A Prometheus endpoint (``GET /metrics``) over the watched pipelines; see :func:`serve_metrics`.

    ``url`` is where to scrape; ``close()`` (idempotent; also leaving a ``with`` block)
    stops the HTTP server and joins its thread."""

    def __init__(self, source: HasStats, port: int, host: str, name: str) -> None:
        super().__init__(source, name)
        prom = _import("prometheus_client", "prometheus")
        from prometheus_client.core import (  # noqa: PLC0415 - optional
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        watched = self

        class Collector:
            def collect(self) -> Iterable[Any]:
                for metric in watched.snapshot():
                    labels = sorted({k for lab, _ in metric.samples for k in lab})
                    if metric.kind == "histogram":
                        fam = HistogramMetricFamily(metric.name, metric.help, labels=labels, unit="")
                        for lab, (counts, total) in metric.samples:
                            fam.add_metric([lab[k] for k in labels], _cumulative(counts, metric.bounds), total)
                    else:
                        cls = CounterMetricFamily if metric.kind == "counter" else GaugeMetricFamily
                        fam = cls(metric.name, metric.help, labels=labels)
                        for lab, value in metric.samples:
                            fam.add_metric([lab[k] for k in labels], float(value))
                    yield fam

        if not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an int in 0..65535 (0: any free port), got {port!r}")
        self.registry = prom.CollectorRegistry(auto_describe=False)
        self.registry.register(Collector())
        try:
            self._server, self._thread = prom.start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from exc
        self.host = host
        self.port = int(self._server.server_address[1])
        self._closed = False

    @property
    def url(self) -> str:
        """``http://HOST:PORT/metrics``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and join the server's thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)

    def __enter__(self) -> "MetricsServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else self.url
        return f"<MetricsServer {state} watching {sorted(self.sources)}>"


def serve_metrics(source: HasStats, port: int, host: str = "127.0.0.1", name: str = "default") -> MetricsServer:
    """Serve the statistics of ``source`` (a ``Dataset``: its latest pass; or a
    ``PipelineIterator``) to Prometheus at ``http://host:port/metrics``, labelled
    ``pipeline=name``, until ``close()``. ``port=0`` picks a free port (``server.port``).
    Bound to loopback unless ``host`` says otherwise (``"0.0.0.0"``: every interface).
    Needs ``prometheus_client`` (``pip install 'shardfeed[prometheus]'``): ``ImportError``
    otherwise; ``OSError`` naming host and port when it cannot listen there."""
    return MetricsServer(source, port, host, name)


class OtelMetrics(_Watched):
    """OpenTelemetry observable instruments over the watched pipelines; see :func:`otel_metrics`.
    ``close()`` stops reporting (the instruments stay registered, observing nothing)."""

    def __init__(self, source: HasStats, name: str, meter_provider: Any = None) -> None:
        super().__init__(source, name)
        otel = _import("opentelemetry.metrics", "otel")
        from opentelemetry.metrics import Observation  # noqa: PLC0415 - optional

        from .._version import __version__  # noqa: PLC0415

        provider = meter_provider if meter_provider is not None else otel.get_meter_provider()
        self.meter = provider.get_meter("shardfeed", __version__)
        self._closed = False
        self._cache: tuple[float, list[Metric]] | None = None
        self._cache_lock = threading.Lock()

        def observe(metric_name: str, part: str) -> Callable[[Any], Iterable[Any]]:
            def callback(options: Any) -> Iterable[Any]:
                if self._closed:
                    return []
                out = []
                for metric in self._metrics():
                    if metric.name != metric_name:
                        continue
                    for lab, value in metric.samples:
                        if metric.kind != "histogram":
                            out.append(Observation(float(value), lab))
                        elif part == "bucket":
                            out.extend(Observation(c, {**lab, "le": le})
                                       for le, c in _cumulative(value[0], metric.bounds))
                        elif part == "sum":
                            out.append(Observation(float(value[1]), lab))
                        else:
                            out.append(Observation(sum(value[0]), lab))
                return out
            return callback

        for metric in _TEMPLATE:
            base = _otel_name(metric.name)
            if metric.kind == "histogram":
                for part in ("bucket", "sum", "count"):
                    self.meter.create_observable_counter(f"{base}.{part}", [observe(metric.name, part)],
                                                         unit=metric.unit if part == "sum" else "",
                                                         description=f"{metric.help} ({part})")
            elif metric.kind == "counter":
                self.meter.create_observable_counter(base, [observe(metric.name, "")], unit=metric.unit,
                                                     description=metric.help)
            else:
                self.meter.create_observable_gauge(base, [observe(metric.name, "")], unit=metric.unit,
                                                   description=metric.help)

    def _metrics(self) -> list[Metric]:
        # one collection calls every instrument's callback: read the stats once for all of them
        import time  # noqa: PLC0415

        with self._cache_lock:
            now = time.monotonic()
            if self._cache is None or now - self._cache[0] > 0.05:
                self._cache = (now, self.snapshot())
            return self._cache[1]

    def close(self) -> None:
        """Stop reporting (idempotent)."""
        self._closed = True


def otel_metrics(source: HasStats, name: str = "default", meter_provider: Any = None) -> OtelMetrics:
    """Report the statistics of ``source`` (a ``Dataset``: its latest pass; or a
    ``PipelineIterator``) as OpenTelemetry observable metrics of meter ``shardfeed``,
    labelled ``pipeline=name``, read at each collection of ``meter_provider`` (default: the
    global one) until ``close()``. Needs ``opentelemetry-api`` and an SDK
    (``pip install 'shardfeed[otel]'``): ``ImportError`` otherwise."""
    return OtelMetrics(source, name, meter_provider)


def _otel_name(name: str) -> str:
    return name.replace("shardfeed_", "shardfeed.", 1).replace("_", ".")


def _import(module: str, extra: str) -> Any:
    import importlib  # noqa: PLC0415

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"shardfeed telemetry needs {module.split('.')[0]}: pip install 'shardfeed[{extra}]' "
                          f"({exc})") from exc


def _template() -> list[Metric]:
    """Every metric name and kind, from the stats of a pass that has not started (and one
    stage with a queue), so the instruments exist before any data."""
    from .stats import PipelineStats  # noqa: PLC0415

    class _Empty:
        def stats(self) -> PipelineStats:
            st = PipelineStats()
            st.stage("x", "x").sample_queue(0.0)
            st.cpu_sampled_wall_s = 1.0
            return st

    return collect({"template": _Empty()})


_TEMPLATE = _template()
