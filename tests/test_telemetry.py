"""Live telemetry: a Prometheus endpoint scraped over HTTP during a pass, and OpenTelemetry
metrics read with the SDK's in-memory reader; both show the numbers stats() has."""

from __future__ import annotations

import re
import sys
import threading
import time
import urllib.request

import pytest

import shardfeed as sf
from shardfeed.pipeline import from_iterable, from_list

LINE = re.compile(r'^(?P<name>[a-z_]+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$')


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    """``{(metric name, labels): value}`` of one scrape of a Prometheus text endpoint."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            labels = frozenset(tuple(kv.split("=", 1)) for kv in re.findall(r'[a-z_]+="[^"]*"', m["labels"]))
            out[(m["name"], labels)] = float(m["value"])
    return out


def series(sample: dict, name: str) -> dict[frozenset, float]:
    return {labels: v for (n, labels), v in sample.items() if n == name}


def ticking(n: int, pause: float):
    def gen():
        for i in range(n):
            time.sleep(pause)
            yield i
    return gen


def test_prometheus_endpoint_shows_the_pass_growing_with_stable_names_and_labels():
    pytest.importorskip("prometheus_client")
    ds = from_iterable(ticking(60, 0.002)).batch(2).prefetch(2)
    scrapes = []
    with sf.serve_metrics(ds, port=0, name="train") as server:
        assert server.url.startswith("http://127.0.0.1:")  # loopback unless told otherwise
        with iter(ds) as it:
            for i, _ in enumerate(it):
                if i in (5, 25):
                    scrapes.append(scrape(server.url))
            st = it.stats()
        scrapes.append(scrape(server.url))  # after the pass: the pass's final numbers
    first, second, last = scrapes
    key = ("shardfeed_consumer_elements_total", frozenset({("pipeline", '"train"')}))
    assert first[key] < second[key] < last[key] == st.consumer_elements == 30
    stage_names = {dict(lab)["stage"] for lab in series(last, "shardfeed_stage_elements_total")}
    assert stage_names == {f'"{s.name}"' for s in st.stages}
    busy = {dict(lab)["stage"]: v for lab, v in series(last, "shardfeed_stage_busy_seconds_total").items()}
    assert busy['"0:from_iterable"'] == pytest.approx(st.stages[0].busy_s)
    # the same series in every scrape: names and labels do not change while the pass runs
    assert {(n, lab) for n, lab in first if "remedy" not in dict(lab)} == \
        {(n, lab) for n, lab in last if "remedy" not in dict(lab)}
    assert last[("shardfeed_consumer_wait_fraction", frozenset({("pipeline", '"train"')}))] == \
        pytest.approx(st.wait_fraction)
    fills = series(last, "shardfeed_stage_queue_fill_fraction")
    assert [dict(lab)["stage"] for lab in fills] == ['"2:prefetch"']
    waits = series(last, "shardfeed_consumer_waits_count")
    assert list(waits.values()) == [float(st.waited_calls)]
    gains = series(last, "shardfeed_remedy_expected_gain")
    assert [dict(lab)["remedy"] for lab in gains] == [f'"{st.remedy().id}"']


def test_prometheus_endpoint_closes_and_frees_its_port():
    pytest.importorskip("prometheus_client")
    before = set(threading.enumerate())
    server = sf.serve_metrics(from_list([1]), port=0)
    url = server.url
    assert scrape(url)  # the metrics of a pass not started yet are served too
    server.close()
    server.close()  # idempotent
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)
    assert not [t for t in set(threading.enumerate()) - before if t.is_alive()]


def test_two_pipelines_on_one_endpoint_and_a_name_given_twice():
    pytest.importorskip("prometheus_client")
    a, b = from_list(list(range(10))), from_list(list(range(4)))
    with sf.serve_metrics(a, port=0, name="train") as server:
        server.add(b, name="eval")
        with pytest.raises(ValueError, match="'eval' is watched already"):
            server.add(a, name="eval")
        list(iter(a)), list(iter(b))
        got = series(scrape(server.url), "shardfeed_consumer_elements_total")
    assert got == {frozenset({("pipeline", '"train"')}): 10.0, frozenset({("pipeline", '"eval"')}): 4.0}


def test_storage_reads_reach_the_endpoint(http_dir):
    pytest.importorskip("prometheus_client")
    directory, base = http_dir
    with sf.TFRecordWriter(str(directory / "a.tfrecord")) as w:
        for i in range(200):
            w.write(b"x" * 100 + bytes([i % 256]))
    ds = sf.read_tfrecord(f"{base}/a.tfrecord")
    with sf.serve_metrics(ds, port=0) as server:
        with iter(ds) as it:
            assert len(list(it)) == 200
            io = it.stats().storage
        got = scrape(server.url)
    lab = frozenset({("pipeline", '"default"')})
    assert got[("shardfeed_storage_requests_total", lab)] == io.requests >= 1
    assert got[("shardfeed_storage_read_bytes_total", lab)] == io.bytes_fetched > 20000
    assert got[("shardfeed_storage_request_latency_seconds_count", lab)] == io.latency_count >= io.requests
    inf = frozenset({("pipeline", '"default"'), ("le", '"+Inf"')})
    assert got[("shardfeed_storage_request_latency_seconds_bucket", inf)] == io.latency_count


def test_a_port_in_use_is_a_clear_error():
    pytest.importorskip("prometheus_client")
    with sf.serve_metrics(from_list([1]), port=0) as server:
        with pytest.raises(OSError, match=f"cannot serve metrics on 127.0.0.1:{server.port}"):
            sf.serve_metrics(from_list([1]), port=server.port)


def test_missing_client_library_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ImportError, match=r"shardfeed\[prometheus\]"):
        sf.serve_metrics(from_list([1]), port=0)
    monkeypatch.setitem(sys.modules, "opentelemetry.metrics", None)
    with pytest.raises(ImportError, match=r"shardfeed\[otel\]"):
        sf.otel_metrics(from_list([1]))
    with pytest.raises(TypeError, match="Dataset or PipelineIterator"):
        sf.otel_metrics([1, 2])


def _otel_points(reader) -> dict[str, list]:
    data = reader.get_metrics_data()
    out: dict[str, list] = {}
    for rm in data.resource_metrics if data is not None else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).extend(m.data.data_points)
    return out


def test_otel_metrics_through_the_in_memory_reader():
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    ds = from_iterable(ticking(40, 0.002)).prefetch(2)
    exporter = sf.otel_metrics(ds, name="train", meter_provider=provider)
    seen = []
    with iter(ds) as it:
        for i, _ in enumerate(it):
            if i in (5, 30):
                seen.append(_otel_points(reader))
                time.sleep(0.06)  # past the exporter's 50 ms reuse of one reading
        st = it.stats()
    time.sleep(0.06)
    seen.append(_otel_points(reader))
    first, second, last = seen
    elements = [p.value for p in last["shardfeed.consumer.elements"]]
    assert first["shardfeed.consumer.elements"][0].value < second["shardfeed.consumer.elements"][0].value
    assert elements == [40] == [st.consumer_elements]
    attrs = {tuple(sorted(p.attributes.items())) for p in last["shardfeed.stage.elements"]}
    assert attrs == {(("pipeline", "train"), ("stage", s.name)) for s in st.stages}
    assert set(first) == set(second)  # the same instruments in every collection
    buckets = {p.attributes["le"]: p.value for p in last["shardfeed.consumer.waits.bucket"]}
    assert buckets["+Inf"] == st.waited_calls
    exporter.close()
    time.sleep(0.06)
    assert _otel_points(reader).get("shardfeed.consumer.elements", []) == []  # closed: reports nothing
    provider.shutdown()
