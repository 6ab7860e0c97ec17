"""One error policy (``on_error``) for framing, parsing and map: raise, skip (counted in
``stats()`` with where each error happened) or a handler that decides per error."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import shardfeed as sf
from shardfeed.errors import CorruptRecordError, DecodeError, ParseError
from shardfeed.formats.example import encode_example
from shardfeed.formats.tfrecord import frame

SPEC = {"x": sf.FixedLen("int64")}
GOOD = list(range(40))
NOT_AN_EXAMPLE = 10  # record 10 is not an Example at all
MISSING_X = 20  # record 20 is an Example without the required feature
BAD_CRC = 30  # record 30's data CRC does not match


def _write(path):
    frames = []
    for i in GOOD:
        if i == NOT_AN_EXAMPLE:
            rec = b"\xff\xff\xff"
        elif i == MISSING_X:
            rec = encode_example({"y": [i]})
        else:
            rec = encode_example({"x": [i]})
        f = bytearray(frame(rec))
        if i == BAD_CRC:
            f[-1] ^= 0xFF
        frames.append(bytes(f))
    path.write_bytes(b"".join(frames))
    return str(path)


def _offset_of(k):
    """The byte offset of record ``k``'s frame in the file ``_write`` makes."""
    sizes = [len(frame(b"\xff\xff\xff" if i == NOT_AN_EXAMPLE else
                       encode_example({"y": [i]} if i == MISSING_X else {"x": [i]}))) for i in range(k)]
    return sum(sizes)


EXPECTED = [i for i in GOOD if i not in (NOT_AN_EXAMPLE, MISSING_X, BAD_CRC)]


def _values(ds):
    it = iter(ds)
    out = []
    for x in it:
        v = np.asarray(x["x"]).reshape(-1).tolist()
        out.extend(v)
    return out, it.stats()


PIPELINES = {
    "records": lambda ds: ds,
    "fused batch": lambda ds: ds.batch(8),
    "fused batch, no threads": None,  # built with num_parallel_reads=None below
    "batch after a stage": lambda ds: ds.skip(0).batch(8),
}


def _pipeline(name, path, **kw):
    if name == "fused batch, no threads":
        return sf.read_tfrecord(path, SPEC, num_parallel_reads=None, **kw).batch(8)
    return PIPELINES[name](sf.read_tfrecord(path, SPEC, **kw))


@pytest.mark.parametrize("name", list(PIPELINES))
def test_skip_drops_each_bad_frame_and_record_and_counts_them_by_stage(tmp_path, name):
    path = _write(tmp_path / "mixed.tfrecord")
    got, stats = _values(_pipeline(name, path, on_error="skip"))
    assert got == EXPECTED
    skipped = stats.to_dict()["skipped"]
    assert skipped["total"] == 3 and skipped["by_stage"] == {"read": 1, "parse": 2}
    reads = [e for e in skipped["examples"] if e["stage"] == "read"]
    assert reads[0]["url"].endswith("mixed.tfrecord") and reads[0]["check"] == "data crc"
    assert reads[0]["offset"] == _offset_of(BAD_CRC)
    parses = [e for e in skipped["examples"] if e["stage"] == "parse"]
    if name == "batch after a stage":  # records arrive without their place in the file
        assert [e["record_index"] for e in parses] == [NOT_AN_EXAMPLE % 8, MISSING_X % 8]
    else:
        assert [e["offset"] for e in parses] == [_offset_of(NOT_AN_EXAMPLE), _offset_of(MISSING_X)]
    errors = {e["error"].split(":")[0] for e in skipped["examples"]}
    assert errors == {"CorruptRecordError", "DecodeError", "ParseError"}
    assert "skipped: 3 errors" in str(stats)


@pytest.mark.parametrize("name", list(PIPELINES))
def test_raise_stops_at_the_first_bad_record_naming_it(tmp_path, name):
    path = _write(tmp_path / "mixed.tfrecord")
    with pytest.raises(DecodeError) as info:
        _values(_pipeline(name, path))
    notes = "\n".join(getattr(info.value, "__notes__", []))
    if name == "batch after a stage":  # records arrive without their place in the file
        assert info.value.record_index == NOT_AN_EXAMPLE % 8
    else:
        assert f"byte offset {_offset_of(NOT_AN_EXAMPLE)} of" in notes and "mixed.tfrecord" in notes


def test_a_handler_sees_each_error_with_its_context_and_skips_by_returning(tmp_path):
    path = _write(tmp_path / "mixed.tfrecord")
    seen = []
    got, stats = _values(sf.read_tfrecord(path, SPEC, on_error=lambda exc, ctx: seen.append((type(exc), ctx))))
    assert got == EXPECTED
    assert [t for t, _ in seen] == [DecodeError, ParseError, CorruptRecordError]
    assert [c["stage"] for _, c in seen] == ["parse", "parse", "read"]
    assert all("offset" in c for _, c in seen)
    assert stats.errors.total == 3


def test_a_handler_that_raises_stops_the_pass_with_its_exception(tmp_path):
    path = _write(tmp_path / "mixed.tfrecord")

    class Stop(Exception):
        pass

    def handler(exc, ctx):
        if isinstance(exc, ParseError):
            raise Stop(ctx["stage"])
        # anything else: skip

    ds = sf.read_tfrecord(path, SPEC, on_error=handler).batch(4)
    got = []
    with pytest.raises(Stop, match="parse"):
        for b in ds:
            got.extend(b["x"].tolist())
    assert got == [i for i in range(MISSING_X) if i != NOT_AN_EXAMPLE][: len(got)]
    assert len(got) >= 16  # the batches before the one holding record 20


@pytest.mark.parametrize("parallel", [None, 2])
def test_map_skips_the_elements_its_function_fails_on_and_names_them(tmp_path, parallel):
    def fn(x):
        if x % 7 == 3:
            raise ZeroDivisionError(f"no {x}")
        return x * 10

    ds = sf.from_list(list(range(30))).map(fn, num_parallel_calls=parallel, on_error="skip")
    it = iter(ds)
    got = list(it)
    assert got == [x * 10 for x in range(30) if x % 7 != 3]
    skipped = it.stats().to_dict()["skipped"]
    assert skipped["by_stage"] == {"map": 4}
    assert [e["element"] for e in skipped["examples"]] == [x for x in range(30) if x % 7 == 3]
    assert all(e["error"].startswith("ZeroDivisionError: no ") for e in skipped["examples"])
    with pytest.raises(ZeroDivisionError):
        list(sf.from_list(list(range(30))).map(fn, num_parallel_calls=parallel))


def _fails_on_odd(x):
    if x % 2:
        raise ValueError(f"odd {x}")
    return x


def test_map_in_processes_skips_too():
    ds = sf.from_list(list(range(12))).map(_fails_on_odd, num_parallel_calls=2, use_processes=True, on_error="skip")
    it = iter(ds)
    assert list(it) == [0, 2, 4, 6, 8, 10]
    assert it.stats().errors.by_stage["map"] == 6


def test_skipping_makes_the_count_unknown_and_bad_arguments_are_refused(tmp_path):
    path = _write(tmp_path / "mixed.tfrecord")
    assert sf.read_tfrecord(path, SPEC, on_error="skip").cardinality() is None
    assert sf.from_list([1, 2]).map(abs, on_error="skip").cardinality() is None
    with pytest.raises(ValueError, match="on_error must be"):
        sf.read_tfrecord(path, SPEC, on_error="ignore")
    with pytest.raises(ValueError, match="disagree"):
        sf.read_tfrecord(path, SPEC, on_corrupt="skip", on_error="raise")
    # the older on_corrupt="skip" still skips frames (and only frames)
    ds = sf.read_tfrecord(path)  # serialized records: no parsing
    with pytest.raises(CorruptRecordError):
        list(ds)
    assert len(list(sf.read_tfrecord(path, on_corrupt="skip"))) == len(GOOD) - 1


def test_skipped_read_errors_also_count_in_read_stats(tmp_path):
    path = _write(tmp_path / "mixed.tfrecord")
    ds = sf.read_tfrecord(path, on_error="skip")
    assert len(list(ds)) == len(GOOD) - 1
    assert ds.read_stats.skipped_records == 1 and ds.read_stats.corrupt[0].check == "data crc"


@pytest.mark.parametrize("exc", [
    DecodeError("bad tag", record_index=3, url="s3://b/k", offset=12),
    ParseError("expected 1 int64 values", feature="x", record_index=2),
    CorruptRecordError("data crc", "s3://b/k", 40, 1, "detail"),
    sf.IteratorClosedError(),
])
def test_public_exceptions_pickle_with_their_attributes_and_notes(exc):
    exc.add_note("in record at byte offset 7")
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc) and str(back) == str(exc)
    assert back.__dict__ == exc.__dict__


def test_a_flood_of_skipped_errors_is_counted_whole_and_logged_in_moderation(tmp_path, caplog):
    """A shard with every other frame damaged, read under skip, record by record: every bad
    frame counted (``read_stats``, the errors of the pass), but the log holds a burst of
    warnings and then at most one a second, saying how many each stands for, not a line a
    record."""
    import logging

    from shardfeed.errors import SKIP_WARNINGS, SkipWarnings
    from shardfeed.formats.crc import masked_crc32c

    path = str(tmp_path / "s.tfrecord")
    data = bytearray()
    for i in range(800):  # every other frame's data CRC wrong: 400 skips, each its own
        record = sf.encode_example({"x": [i]})
        head = len(record).to_bytes(8, "little")
        crc = masked_crc32c(record) ^ (i % 2)
        data += head + masked_crc32c(head).to_bytes(4, "little") + record + crc.to_bytes(4, "little")
    open(path, "wb").write(bytes(data))
    fresh = SkipWarnings()
    saved = dict(SKIP_WARNINGS.__dict__)
    SKIP_WARNINGS.__dict__.update({k: v for k, v in fresh.__dict__.items() if k != "lock"})
    try:
        with caplog.at_level(logging.WARNING):
            ds = sf.read_tfrecord(path, on_corrupt="skip")
            got = list(ds)
    finally:
        SKIP_WARNINGS.__dict__.update({k: v for k, v in saved.items() if k != "lock"})
    assert len(got) == 400 and ds.read_stats.skipped_records == 400  # every one counted
    lines = [r.getMessage() for r in caplog.records if "skip" in r.getMessage()]
    assert 20 <= len(lines) <= 30, len(lines)  # the burst (plus a line a second at most, and the pass's)
    assert any("logged at most one a second" in m for m in lines)
