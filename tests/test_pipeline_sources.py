"""Sources: TFRecord (with deferred batch parsing), in-memory, text, and the plug-in interface."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

import shardfeed as sf
from shardfeed.formats.example import parse_example
from shardfeed.pipeline import AUTOTUNE, SourceDataset, from_iterable, from_list, read_text
from shardfeed.pipeline.state import elements_equal

from .test_pipeline_helpers import SPEC, example, write_shards


def test_tfrecord_batch_yields_numpy_columns_equal_to_parse_example(tmp_path):
    files = write_shards(tmp_path, n_files=2, per_file=5)
    batches = list(sf.read_tfrecord(files, spec=SPEC).batch(4))
    assert [len(b["id"]) for b in batches] == [4, 4, 2]
    expected = parse_example([example(i) for i in [0, 1, 2, 3]], SPEC)
    assert elements_equal(batches[0], expected)
    assert batches[0]["x"].dtype == np.float32 and batches[0]["x"].shape == (4, 2)


def test_batch_parses_whole_batches_instead_of_single_records(tmp_path, monkeypatch):
    files = write_shards(tmp_path, n_files=1, per_file=6)
    import shardfeed.pipeline.batch as batch_mod
    import shardfeed.pipeline.records as sources_mod

    calls = []
    real = batch_mod.parse_batch
    monkeypatch.setattr(batch_mod, "parse_batch",
                        lambda recs, spec, **kw: calls.append(len(recs)) or real(recs, spec, **kw))
    monkeypatch.setattr(sources_mod, "parse_single_example", lambda *a: pytest.fail("parsed one record at a time"))
    ds = sf.read_tfrecord(files, spec=SPEC).shuffle(4, seed=0).shard(0, 1).prefetch(2).batch(3)
    assert sum(len(b["id"]) for b in ds) == 6
    assert calls == [3, 3]


def test_tfrecord_without_batch_yields_parsed_dicts(tmp_path):
    files = write_shards(tmp_path, n_files=1, per_file=3)
    rows = list(sf.read_tfrecord(files, spec=SPEC))
    assert [int(r["id"]) for r in rows] == [0, 1, 2]
    assert list(rows[2]["ids"]) == [0, 1]


def test_map_after_tfrecord_sees_parsed_records_and_batch_stacks_them(tmp_path):
    files = write_shards(tmp_path, n_files=1, per_file=4)
    b = next(iter(sf.read_tfrecord(files, spec=SPEC).map(lambda r: r["x"] * 2).batch(4)))
    assert b.shape == (4, 2) and b[3].tolist() == [6.0, -6.0]


@pytest.mark.parametrize("reads", [None, 1, 2, 3, AUTOTUNE])
def test_parallel_reads_never_change_the_order(tmp_path, reads):
    files = write_shards(tmp_path, n_files=3, per_file=2)
    ds = sf.read_tfrecord(files, spec=SPEC, num_parallel_reads=reads)
    ids = [int(b) for b in np.concatenate([b["id"] for b in ds.batch(4)])]
    assert ids == [0, 1, 1000, 1001, 2000, 2001]
    assert list(sf.read_tfrecord(files, num_parallel_reads=reads)) == list(sf.read_tfrecord(files))
    assert [int(r["id"]) for r in ds] == ids


def test_gzip_tfrecord_reads_same_records(tmp_path):
    plain = write_shards(tmp_path, 1, 4)
    gz = str(tmp_path / "x.tfrecord.gz")
    sf.write_records(gz, [example(i) for i in range(4)], compression="GZIP")
    assert list(sf.read_tfrecord(gz)) == list(sf.read_tfrecord(plain))


def test_parse_error_names_file_and_offset(tmp_path):
    p = str(tmp_path / "bad.tfrecord")
    sf.write_records(p, [example(0), b"\xff\xff not an example"])
    with pytest.raises(sf.DecodeError) as info:
        list(sf.read_tfrecord(p, spec=SPEC))
    assert any("bad.tfrecord" in n and "byte offset" in n for n in getattr(info.value, "__notes__", []))


def test_read_stats_count_records_of_every_pass(tmp_path):
    files = write_shards(tmp_path, n_files=2, per_file=3)
    ds = sf.read_tfrecord(files)
    list(ds)
    list(ds)
    assert ds.read_stats.records == 12


def test_from_list_and_from_iterable_make_repeatable_passes():
    ds = from_list([1, 2, 3])
    assert list(ds) == list(ds) == [1, 2, 3]
    gen = from_iterable(lambda: (i * i for i in range(4)))
    assert list(gen) == list(gen) == [0, 1, 4, 9]
    assert list(from_iterable(range(3))) == [0, 1, 2]
    assert list(sf.Dataset.from_list("ab")) == ["a", "b"]


def test_from_iterable_rejects_one_shot_iterator_with_a_hint():
    with pytest.raises(TypeError, match="one-shot iterator"):
        from_iterable(iter([1, 2]))
    with pytest.raises(TypeError, match="from_iterable"):
        from_list(x for x in [1])


def test_read_text_lines_across_files_and_gzip(tmp_path):
    (tmp_path / "a.txt").write_text("one\ntwo\r\nthree")
    with gzip.open(tmp_path / "b.txt.gz", "wt") as f:
        f.write("four\n\nsix\n")
    assert list(read_text([str(tmp_path / "a.txt"), str(tmp_path / "b.txt.gz")])) == [
        "one", "two", "three", "four", "", "six"]


def test_read_text_bad_utf8_names_file_and_line(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"ok\n\xff\xfe\n")
    with pytest.raises(UnicodeDecodeError, match=r"a\.txt, line 2"):
        list(read_text(str(tmp_path / "a.txt")))


def test_missing_file_is_reported_at_construction(tmp_path):
    with pytest.raises(FileNotFoundError):
        sf.read_tfrecord(str(tmp_path / "nope-*.tfrecord"))
    with pytest.raises(FileNotFoundError):
        read_text(str(tmp_path / "nope.txt"))


class Squares(SourceDataset):
    """A plug-in source as another layer would write one: cursor state, own reader."""

    kind = "squares"

    def __init__(self, n):
        self.n = n

    def open(self, state, raw):
        ds = self

        class Reader:
            bytes_read = 0

            def __init__(self):
                self.i = state["i"] if state else 0

            def __next__(self):
                if self.i >= ds.n:
                    raise StopIteration
                self.i += 1
                self.bytes_read += 8
                return (self.i - 1) ** 2

            def get_state(self):
                return {"i": self.i}

            def close(self):
                pass

        return Reader()


def test_plugin_source_works_with_stages_and_counts_bytes():
    ds = Squares(5).batch(2)
    it = iter(ds)
    assert [b.tolist() for b in it] == [[0, 1], [4, 9], [16]]
    src = it.stats().stages[0]
    assert src.name.endswith("squares") and src.bytes == 40 and src.elements == 5


def test_legacy_subclass_with_only_iter_still_works():
    class Old(sf.Dataset):
        def __iter__(self):
            return iter([1, 2, 3])

    assert list(Old().map(lambda x: x + 1)) == [2, 3, 4]
