"""An image folder listed in parts, as Spark's executors list it: the driver lists the top
level only (:func:`folder_layout`), each part's files are listed apart
(:func:`folder_part_files`), and the rows numbered across the parts in order are exactly
:func:`read_image_folder`'s, on a local disk and on S3 (moto on 127.0.0.1)."""

from __future__ import annotations

import os

import pytest

from shardfeed import storage
from shardfeed.convert.options import DiscardRecord
from shardfeed.convert.sources import folder_item, folder_layout, folder_part_files, read_image_folder
from shardfeed.storage.urls import mask

# (name, files under the root); "" marks an empty folder
LAYOUTS = {
    "labels": ["cat/1.jpg", "cat/2.jpg", "dog/a.jpg", "dog/b/deep.jpg", "top.jpg", ".hidden/x.jpg",
               "cat/.DS_Store", "dog.jpg"],
    "splits": ["train/cat/1.jpg", "train/dog/2.jpg", "TEST/cat/3.jpg", "validation/loose.jpg", "train/x/y/z.jpg",
               "a.jpg", "train/.cache/9.jpg", "zzz/"],
    "split names with a non-empty label": ["train/1.jpg", "test/2.jpg", "other/3.jpg"],
    "split names only, files beside them": ["train/a/1.jpg", "test/b/2.jpg", "readme.txt"],
    "flat": ["1.jpg", "2.jpg"],
    "empty": [],
}


def in_parts(root, storage_options=None):
    """Rows and discards as the Spark runner makes them: part by part, numbered in order."""
    with_split, parts = folder_layout(root, storage_options)
    rows, discards, number = [], [], 0
    for p, is_dir in parts:
        for rel, uri in folder_part_files(root, p, is_dir, storage_options):
            number += 1
            item = folder_item(number, rel, uri, with_split, mask(root))
            (discards if isinstance(item, DiscardRecord) else rows).append(item)
    return rows, discards, parts


def _write_local(root, files):
    os.makedirs(root)
    for f in files:
        path = os.path.join(root, f)
        if f.endswith("/"):
            os.makedirs(path)
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(b"x")


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_local_folder_listed_in_parts_gives_the_rows_listed_whole(tmp_path, layout):
    root = str(tmp_path / "f")
    _write_local(root, LAYOUTS[layout])
    rows, discards, _ = read_image_folder(root)
    got_rows, got_discards, parts = in_parts(root)
    assert got_rows == rows  # every field
    assert got_discards == discards
    assert all(len(p) <= 2 for p, _ in parts)  # the driver listed the top level (and split folders)


def test_parts_are_folders_not_files_and_links_to_folders_are_not_followed(tmp_path):
    root = tmp_path / "f"
    _write_local(str(root), [f"label{i}/{j}.jpg" for i in range(5) for j in range(40)] + ["more/x.jpg"])
    os.symlink(root / "label0", root / "linked")  # os.walk does not follow it, nor does the listing
    with_split, parts = folder_layout(str(root))
    assert not with_split
    assert parts == [((f"label{i}",), True) for i in range(5)] + [(("more",), True)]
    rows, _, _ = in_parts(str(root))
    assert len(rows) == 201 and rows == read_image_folder(str(root))[0]


def test_an_empty_split_named_folder_does_not_make_a_label_folder_a_split_layout(tmp_path):
    root = str(tmp_path / "f")
    _write_local(root, ["train/", "cat/1.jpg", "dog/2.jpg"])
    assert folder_layout(root)[0] is False
    rows, discards, _ = in_parts(root)
    assert [(r.label, r.split) for r in rows] == [("cat", None), ("dog", None)] and discards == []


def test_a_missing_folder_is_one_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such folder"):
        folder_layout(str(tmp_path / "nope"))


@pytest.mark.parametrize("layout", ["labels", "splits", "split names only, files beside them"])
def test_a_folder_on_s3_listed_in_parts_gives_the_rows_listed_whole(s3_bucket, layout):
    bucket, so = s3_bucket
    root = f"s3://{bucket}/images"
    for f in LAYOUTS[layout]:
        if not f.endswith("/"):  # S3 has no empty folders
            storage.write_bytes(f"{root}/{f}", b"x", so)
    rows, discards, _ = read_image_folder(root, so)
    got_rows, got_discards, parts = in_parts(root, so)
    assert rows and got_rows == rows  # every field
    assert got_discards == discards
    assert all(len(p) <= 2 for p, _ in parts)



@pytest.mark.skipif(os.name != "posix" or os.uname().sysname == "Darwin",
                    reason="needs a file system that takes any bytes as a name")
def test_a_file_or_label_folder_whose_name_is_not_utf8_is_discarded_with_its_path(tmp_path):
    import io

    from PIL import Image

    import shardfeed as sf

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(buf, "JPEG")
    root = tmp_path / "in"
    for rel in (b"cat/1.jpg", b"cat/bad\xff\xfe.jpg", b"dog/2.jpg", b"d\xe9j\xe0/3.jpg", b"caf\xc3\xa9/4.jpg"):
        path = os.fsencode(root) + b"/" + rel
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(buf.getvalue())
    rows, discards, _ = read_image_folder(str(root))
    assert sorted(r.label for r in rows) == ["caf\u00e9", "cat", "dog"]  # a UTF-8 name is kept as it is
    assert sorted((d.source.rsplit("/", 2)[-2:], d.reason) for d in discards) == [
        (["cat", "bad\\xff\\xfe.jpg"], f"path is not valid UTF-8 (at byte {len(str(root)) + 8})"),
        (["d\\xe9j\\xe0", "3.jpg"], f"path is not valid UTF-8 (at byte {len(str(root)) + 2})"),
    ]
    assert in_parts(str(root))[1] == discards  # the Spark runner's listing says the same
    out = tmp_path / "out"
    result = sf.convert(str(root), str(out), progress=False)
    assert (result.rows_read, result.records_written, result.rows_discarded) == (5, 3, 2)
    report = (out / "data-discards.csv").read_text(encoding="utf-8")
    assert "bad\\xff\\xfe.jpg,path is not valid UTF-8" in report
