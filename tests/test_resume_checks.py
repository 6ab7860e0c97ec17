"""A saved state is restored only into a reader it fits (issue 39 items 6 and 9): the same
files, seed, shuffle mode and block cut, and the same reader of the same number, except
under shuffle='global', whose states any reader of any number resumes; URLs in a state
carry no signature, and a restore reads the dataset's live URLs."""

from __future__ import annotations

import json

import numpy as np
import pytest

import shardfeed as sf

from .test_pipeline_helpers import SPEC, example, write_sized_shards

SIZES = [60, 45, 80, 30, 50]
EVERY = sorted(f * 1000 + i for f, n in enumerate(SIZES) for i in range(n))


def _files(tmp_path):
    return write_sized_shards(tmp_path, SIZES, index=True, prefix="rc")


def _ids(batches):
    return [int(v) for b in batches for v in np.atleast_1d(b["id"])]


def _saved(ds, steps=4):
    with iter(ds) as it:
        head = _ids(next(it) for _ in range(steps))
        return head, json.loads(json.dumps(it.get_state()))


def _restore(ds, state):
    with ds.iter_from_state(state) as it:
        return _ids(it)


def _reader(files, mode, seed=1, slice_id=None, slice_count=None, block_size=16):
    return sf.read_tfrecord(files, spec=SPEC, shuffle=mode, seed=seed if mode else None, block_size=block_size,
                            slice_id=slice_id, slice_count=slice_count).batch(10)


@pytest.mark.parametrize("mode", ["files", "blocks", "global"])
def test_a_state_of_another_seed_is_refused(tmp_path, mode):
    files = _files(tmp_path)
    _, state = _saved(_reader(files, mode, seed=1))
    with pytest.raises(ValueError, match=r"seed=1.*seed=2.*resume with the seed"):
        _restore(_reader(files, mode, seed=2), state)


@pytest.mark.parametrize("mode", [None, "files", "blocks", "global"])
def test_a_state_of_other_files_is_refused(tmp_path, mode):
    files = _files(tmp_path)
    _, state = _saved(_reader(files, mode))
    with pytest.raises(ValueError, match=r"other files.*5 files or ranges, this reader 4"):
        _restore(_reader(files[:-1], mode), state)
    with pytest.raises(ValueError, match=r"other files.*not the same ones"):
        _restore(_reader(files[::-1], mode), state)


@pytest.mark.parametrize("mode", [None, "files", "blocks"])
def test_another_readers_state_is_refused(tmp_path, mode):
    files = _files(tmp_path)
    _, state = _saved(_reader(files, mode, slice_id=0, slice_count=2), steps=2)
    with pytest.raises(ValueError, match=r"saved by reader 0 of 2, but this is reader 1 of 2"):
        _restore(_reader(files, mode, slice_id=1, slice_count=2), state)
    with pytest.raises(ValueError, match=r"reader 0 of 2, but this is reader 0 of 3"):
        _restore(_reader(files, mode, slice_id=0, slice_count=3), state)
    with pytest.raises(ValueError, match=r"but this is the only reader"):
        _restore(_reader(files, mode), state)
    # its own reader resumes it, exactly
    head, state = _saved(_reader(files, mode, slice_id=1, slice_count=2), steps=2)
    rest = _restore(_reader(files, mode, slice_id=1, slice_count=2), state)
    assert head + rest == _ids(_reader(files, mode, slice_id=1, slice_count=2))


def test_a_global_shuffle_resumes_any_readers_state_in_any_world(tmp_path):
    files = _files(tmp_path)
    for before, after, pick in [(2, 2, lambda k: 1 - k), (4, 2, lambda k: k), (4, 8, lambda k: k % 4)]:
        seen, states = [], []
        for k in range(before):  # a synchronous step: every reader delivered as many batches
            head, state = _saved(_reader(files, "global", slice_id=k, slice_count=before), steps=3)
            seen += head
            states.append(state)
        rest = []
        for k in range(after):
            rest += _restore(_reader(files, "global", slice_id=k, slice_count=after), states[pick(k)])
        assert sorted(seen + rest) == EVERY, (before, after)


def test_a_global_state_resumes_with_another_window(tmp_path):
    files = _files(tmp_path)
    head, state = _saved(_reader(files, "global", block_size=16), steps=3)
    assert sorted(head + _restore(_reader(files, "global", block_size=64), state)) == EVERY


@pytest.mark.parametrize("mode", [None, "files", "blocks", "global"])
def test_a_state_of_an_earlier_version_without_these_fields_still_restores(tmp_path, mode):
    files = _files(tmp_path)
    full = _ids(_reader(files, mode))
    head, state = _saved(_reader(files, mode))

    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in ("files", "seed", "shuffle", "slice")}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    assert head + _restore(_reader(files, mode), strip(state)) == full


def test_a_state_names_a_presigned_url_without_its_signature(s3_bucket, tmp_path):
    import boto3

    bucket, opts = s3_bucket
    client = boto3.client("s3", endpoint_url=opts["endpoint_url"])
    for f in range(2):
        path = tmp_path / f"p{f}.tfrecord"
        sf.write_records(str(path), [example(f * 1000 + i) for i in range(400)], index=False)
        client.upload_file(str(path), bucket, f"signed/p{f}.tfrecord")

    def signed(expires):
        return [client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": f"signed/p{f}.tfrecord"},
                                              ExpiresIn=expires) for f in range(2)]

    urls = signed(600)
    assert "X-Amz-Signature" in urls[0] or "Signature" in urls[0]
    for make in (lambda u: sf.read_tfrecord(u, spec=SPEC).batch(25),
                 lambda u: sf.read_tfrecord(u, spec=SPEC).shuffle(60, seed=3).batch(25)):
        full = _ids(make(urls))
        head, state = _saved(make(urls), steps=9)  # into the second file
        text = json.dumps(state)
        for secret in ("X-Amz-Signature", "X-Amz-Credential", "Signature=", "AWSAccessKeyId"):
            assert secret not in text
        again = signed(900)  # signed anew: another signature and expiry for the same objects
        assert again != urls
        assert head + _restore(make(again), state) == full


@pytest.mark.parametrize("before,after", [(2, 3), (3, 2), (2, 1)])
def test_a_stateful_dataloader_with_another_number_of_workers_says_so(tmp_path, before, after):
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    files = _files(tmp_path)
    ds = sf.read_tfrecord(files, spec=SPEC).batch(5)

    def loader(workers):
        return sdl.StatefulDataLoader(ds.to_torch(slice_id=0, slice_count=1), batch_size=None, num_workers=workers)

    first = loader(before)
    it = iter(first)
    for _ in range(4):
        next(it)
    state = first.state_dict()
    del it, first
    again = loader(after)
    again.load_state_dict(state)
    with pytest.raises(ValueError, match=rf"DataLoader worker \d of {before}.*this DataLoader has {after} workers"):
        next(iter(again))
