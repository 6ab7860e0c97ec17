"""Every reader's first argument is ``source``; the older keyword names still work, with a
DeprecationWarning naming the new one (issue 18 #2)."""

from __future__ import annotations

import inspect
import warnings

import pytest

import shardfeed as sf
from shardfeed.tables.record_reader import TableRecordReader
from tests.test_pipeline_helpers import write_shards

READERS = {  # reader -> its older first-argument name
    "read_tfrecord": "files", "TFRecordDataset": "files", "read_records": "urls", "read_shard": "works",
    "read_queue": "queue", "read_text": "files", "read_csv": "files", "read_table": "tables",
    "read_converted": "output_dir", "read_dataset": "output_dir",
}


@pytest.mark.parametrize("name", sorted(READERS))
def test_the_first_argument_of_every_reader_is_source(name):
    params = [p for p in inspect.signature(getattr(sf, name)).parameters if p != "self"]
    assert params[0] == "source"


def test_table_record_reader_methods_take_source_and_pai_classes_keep_pai_names():
    for method in (TableRecordReader.read_up_to, TableRecordReader.read):
        assert list(inspect.signature(method).parameters)[1] == "source"
    # PAI's TableRecordDataset keeps PAI's documented name; decode_csv keeps TensorFlow's
    assert list(inspect.signature(sf.TableRecordDataset).parameters)[0] == "filenames"
    assert list(inspect.signature(sf.decode_csv).parameters)[0] == "records"


def _same_with_old_keyword(fn, old, source, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new name warns about nothing
        new = fn(source=source, **kw)
    with pytest.warns(DeprecationWarning, match=rf"\({old}=\.\.\.\) is now .*\(source=\.\.\.\)") as w:
        old_result = fn(**{old: source}, **kw)
    assert w[0].filename == __file__  # points at the caller
    return new, old_result


def test_old_keywords_of_the_record_readers_give_the_same_records(tmp_path):
    files = write_shards(tmp_path, n_files=2, per_file=3)
    for fn, old in ((sf.read_tfrecord, "files"), (sf.TFRecordDataset, "files")):
        new, older = _same_with_old_keyword(fn, old, files)
        assert list(new) == list(older) and len(list(new)) == 6
    new, older = _same_with_old_keyword(sf.read_records, "urls", files)
    assert list(new) == list(older)
    new, older = _same_with_old_keyword(sf.read_shard, "works", files, slice_id=0, slice_count=2)
    assert list(new) == list(older) and len(list(new)) == 3
    q = sf.WorkQueue(files, backend="memory://names", name="names", shuffle=False)
    new, older = _same_with_old_keyword(sf.read_queue, "queue", q)
    assert type(new) is type(older) and len(list(new)) == 6  # one queue: the first pass takes every item
    with pytest.raises(TypeError, match=r"read_tfrecord\(\) got 'source' and its older name 'files'"):
        sf.read_tfrecord(files, files=files)
    with pytest.raises(TypeError, match="got 'source' and its older name"):
        sf.read_tfrecord(source=files, files=files)


def test_old_keywords_of_the_text_csv_and_table_readers(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("1,x\n2,y\n")
    new, older = _same_with_old_keyword(sf.read_text, "files", str(p))
    assert list(new) == list(older) == ["1,x", "2,y"]
    new, older = _same_with_old_keyword(sf.read_csv, "files", str(p), record_defaults=[0, ""])
    assert list(new) == list(older) == [(1, "x"), (2, "y")]
    pytest.importorskip("pyarrow")
    (tmp_path / "tab").mkdir()
    (tmp_path / "tab" / "a.csv").write_text("id\n1\n2\n")
    new, older = _same_with_old_keyword(sf.read_table, "tables", str(tmp_path / "tab"))
    assert [int(r[0]) for r in new] == [int(r[0]) for r in older] == [1, 2]
    reader = TableRecordReader()
    with pytest.warns(DeprecationWarning, match=r"TableRecordReader.read_up_to\(tables=\.\.\.\)"):
        keys, values = reader.read_up_to(tables=str(tmp_path / "tab"), num_records=5)
    reader.close()
    assert values.tolist() == ["1", "2"]


def test_old_keyword_of_read_converted_reaches_the_function(tmp_path):
    for fn in (sf.read_converted, sf.read_dataset):
        with pytest.warns(DeprecationWarning, match=r"read_converted\(output_dir=\.\.\.\)"), \
                pytest.raises(FileNotFoundError, match="nothing-here"):
            fn(output_dir=str(tmp_path / "nothing-here"))
