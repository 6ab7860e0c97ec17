"""A local shard truncated while a pass reads it through its map: the page past the new end
faults with SIGBUS, which used to kill the process. The native guard answers the fault with
zero pages and the readers name what was cut: a ``"truncated data"`` CorruptRecordError, or
skipped and counted, and never a zero byte delivered as data. Each case runs in a child
process (a regression kills the child, not the test run), and checks what the child got
against the file written: every record delivered is one written, whole, and once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from shardfeed.formats.native import native_available

pytestmark = pytest.mark.skipif(not native_available(), reason="the truncation guard is in the native core")

RECORDS = 60_000
PAYLOAD = 100

CHILD = r"""
import json, os, sys
import numpy as np
import shardfeed as sf

path, mode, policy, cut, verify = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == "1"
spec = {"x": sf.FixedLen("int64"), "b": sf.FixedLen("bytes")}
kw = {"on_corrupt": policy, "verify_crc": verify}
if mode == "batch":
    ds = sf.read_tfrecord([path], spec, num_parallel_reads=2, **kw).batch(256)
elif mode == "records":
    ds = sf.read_tfrecord([path], **kw)
elif mode == "parsed_records":
    ds = sf.read_tfrecord([path], spec, **kw)
elif mode == "buffer":
    ds = sf.read_tfrecord([path], spec, **kw).shuffle(5000, seed=1).batch(256)
elif mode == "blocks":  # blocks of 64 records: ranges planned on the index, many after the cut
    ds = sf.read_tfrecord([path], spec, shuffle=mode, seed=1, block_size=64, **kw).batch(256)
else:
    ds = sf.read_tfrecord([path], spec, shuffle=mode, seed=1, **kw).batch(256)
seen, bad, err = [], 0, None
at = int(sys.argv[6]) if len(sys.argv) > 6 else 3
try:
    it = iter(ds)
    if at < 0:  # after the pass planned its reads, before any was made
        os.truncate(path, cut)
    for i, b in enumerate(it):
        if i == at:
            os.truncate(path, cut)
        if isinstance(b, dict):
            xs = np.asarray(b["x"]).ravel().tolist()
            vals = list(np.asarray(b["b"]).ravel()) if np.ndim(b["b"]) else [b["b"]]
        else:
            ex = sf.parse_single_example(b, spec)
            xs, vals = [int(np.asarray(ex["x"]).ravel()[0])], [np.asarray(ex["b"]).ravel()[0]]
        seen += xs
        bad += sum(v != b"y" * PAYLOAD for v in vals)
except sf.CorruptRecordError as e:
    err = {"check": e.check, "url": e.url, "offset": e.offset, "text": str(e)}
except sf.DecodeError as e:  # a record past the new end parsed as if it were data
    err = {"check": "decode", "url": None, "offset": None, "text": str(e)}
errors = it.stats().errors.to_dict()
print(json.dumps({"seen": seen, "bad": bad, "error": err, "skipped": errors["total"]}))
""".replace("PAYLOAD", str(PAYLOAD))


def _write(path: str) -> None:
    """The shard, with its index file."""
    import shardfeed as sf

    with sf.TFRecordWriter(path, index=True) as w:
        for i in range(RECORDS):
            w.write(sf.encode_example({"x": [i], "b": [b"y" * PAYLOAD]}))


def _run(path: str, mode: str, policy: str, cut: int, env: dict | None = None,
         verify: bool = True, at: int = 3) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHILD, path, mode, policy, str(cut), "1" if verify else "0", str(at)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})


def _whole_frames(path: str) -> tuple[int, int]:
    """(frames wholly in the file as it is now, where the first cut one starts), by walking
    the frame lengths with struct, independently of the readers under test."""
    import struct

    data = open(path, "rb").read()
    pos = n = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        if pos + 16 + length > len(data):
            break
        pos += 16 + length
        n += 1
    return n, pos


@pytest.mark.parametrize("verify", [True, False], ids=["crc", "no_crc"])
@pytest.mark.parametrize("policy", ["raise", "skip"])
@pytest.mark.parametrize("mode", ["batch", "records", "parsed_records", "buffer", "global", "blocks"])
def test_a_shard_truncated_under_a_pass_is_named_or_counted_and_never_kills_it(tmp_path, mode, policy, verify):
    """With ``verify_crc=False`` too: no CRC says the zeros are wrong there, the guard does
    (the scan stops at the new end, the parser and the copies ask which records lie past it),
    and for the rest of the page that holds the new end, which reads as zeros without a
    fault, a look at the file's size after each batch is read (found from outside: the
    record that straddles the new end came out with zeros, or as a DecodeError)."""
    path = str(tmp_path / "a.tfrecord")
    _write(path)
    size = os.path.getsize(path)
    cut = size // 4 + 7  # in the middle of a record, past what the first batches read, inside the first chunk
    got = _run(path, mode, policy, cut, verify=verify)
    assert got.returncode == 0, f"the child died ({got.returncode}): {got.stderr[-2000:]}"
    out = json.loads(got.stdout.strip().splitlines()[-1])
    seen = out["seen"]
    # whatever was delivered is what was written, whole and once
    assert out["bad"] == 0, out["bad"]
    assert len(seen) == len(set(seen)) and all(0 <= x < RECORDS for x in seen)
    whole, cut_frame = _whole_frames(path)  # the records the file still holds, and where the cut one starts
    if policy == "raise":
        err = out["error"]
        assert err is not None, f"{len(seen)} records delivered and no error"
        assert err["check"] == "truncated data" and err["url"].endswith("a.tfrecord"), err
        assert err["offset"] >= cut_frame, (err, cut_frame)  # never a record the file still holds
    else:
        assert out["error"] is None and out["skipped"] >= 1, out
        if mode == "global":  # every record of the index is delivered or counted as lost
            assert len(seen) + out["skipped"] == RECORDS, (len(seen), out["skipped"])
        if mode == "batch":  # read as a sequential reader reads the file now: up to the cut frame
            assert sorted(seen) == list(range(whole)), (len(seen), whole)



@pytest.mark.parametrize("policy", ["raise", "skip"])
@pytest.mark.parametrize("mode", ["batch", "records", "buffer", "global", "blocks"])
def test_a_cut_at_a_frame_boundary_is_reported_too(tmp_path, mode, policy):
    """The file cut exactly where a frame ends (no frame is cut in two: the file looks whole)
    after the pass found more (found from outside: a blocks shuffle read its ranges planned on
    the index to the new end and lost the rest without a word)."""
    path = str(tmp_path / "a.tfrecord")
    _write(path)
    ends, pos, data = [], 0, open(path, "rb").read()
    while pos < len(data):
        pos += 16 + int.from_bytes(data[pos:pos + 8], "little")
        ends.append(pos)
    cut = min(ends, key=lambda e: abs(e - len(data) // 4))
    got = _run(path, mode, policy, cut)
    assert got.returncode == 0, f"the child died ({got.returncode}): {got.stderr[-2000:]}"
    out = json.loads(got.stdout.strip().splitlines()[-1])
    seen = out["seen"]
    assert out["bad"] == 0 and len(seen) == len(set(seen)) and all(0 <= x < RECORDS for x in seen)
    whole = ends.index(cut) + 1  # the records the file still holds
    if mode in ("batch", "records") and policy == "skip":  # sequential: what the file holds, then one cut frame
        assert sorted(seen) == list(range(whole)) and out["skipped"] == 1, (len(seen), whole, out["skipped"])
    elif policy == "skip":
        assert out["skipped"] >= 1 and len(seen) < RECORDS, out["skipped"]
        if mode == "global":
            assert len(seen) + out["skipped"] == RECORDS
    else:
        assert out["error"] is not None and out["error"]["check"] == "truncated data", out["error"]
        assert out["error"]["offset"] >= cut, (out["error"], cut)


@pytest.mark.parametrize("mode", ["batch", "buffer", "global", "blocks"])
def test_a_cut_before_the_first_read_under_skip_counts_and_goes_on(tmp_path, mode):
    """The file cut after the pass planned its reads (``iter()``), before any record was read
    (found from outside: a global shuffle under skip stopped at once, "shorter than its index
    file says", delivering nothing of any file): what it still holds is delivered, the rest
    counted (a global shuffle: every record of the index, delivered or counted)."""
    path = str(tmp_path / "a.tfrecord")
    _write(path)
    cut = os.path.getsize(path) // 2 + 7
    got = _run(path, mode, "skip", cut, at=-1)
    assert got.returncode == 0, f"the child died ({got.returncode}): {got.stderr[-2000:]}"
    out = json.loads(got.stdout.strip().splitlines()[-1])
    whole, _ = _whole_frames(path)
    assert out["error"] is None and out["bad"] == 0, out["error"]
    assert sorted(out["seen"]) == list(range(whole)), (len(out["seen"]), whole)
    assert out["skipped"] >= 1
    if mode == "global":
        assert len(out["seen"]) + out["skipped"] == RECORDS, out["skipped"]


@pytest.mark.parametrize("mode", ["batch", "buffer", "global"])
def test_without_the_guard_the_same_truncation_kills_the_process(tmp_path, mode):
    """The cases above with the guard turned off (``SHARDFEED_SIGBUS_GUARD=0``): SIGBUS, as
    before the guard, so the cases above do test it."""
    path = str(tmp_path / "a.tfrecord")
    _write(path)
    got = _run(path, mode, "raise", os.path.getsize(path) // 4 + 7, {"SHARDFEED_SIGBUS_GUARD": "0"})
    assert got.returncode == -signal.SIGBUS, (got.returncode, got.stdout[-500:], got.stderr[-500:])


FOREIGN = r"""
import mmap, os, sys
from shardfeed.formats.chunks import map_file
base, before, read = sys.argv[1], sys.argv[2], sys.argv[3]
import faulthandler
if before == "faulthandler":
    faulthandler.enable()
ours = map_file(base + ".ours")
if before == "faulthandler_after":  # installed over the guard: the next map puts it back on top
    faulthandler.enable()
    ours = map_file(base + ".ours")
assert ours.guarded
if read == "theirs":
    with open(base + ".theirs", "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    os.truncate(base + ".theirs", 10)
else:
    m = memoryview(ours)
    os.truncate(base + ".ours", 10)
print("about to read", flush=True)
print("read", m[50000], ours.lost_from, flush=True)
"""


@pytest.mark.parametrize("before", ["nothing", "faulthandler", "faulthandler_after"])
def test_a_sigbus_outside_shardfeeds_maps_still_ends_the_process(tmp_path, before):
    """The guard answers faults in its own maps only: another map's fault goes to the
    handler installed before (faulthandler's dump, once, or the default action) and ends the
    process as it would without shardfeed; a SIGBUS sent with kill too. A handler installed
    over the guard (``faulthandler.enable()`` after a read) is put second in line again by
    the next map, and a fault in shardfeed's maps is still answered."""
    base = str(tmp_path / "f")

    def run(read: str) -> subprocess.CompletedProcess:
        for suffix in (".ours", ".theirs"):
            with open(base + suffix, "wb") as f:
                f.write(b"z" * 100_000)
        return subprocess.run([sys.executable, "-c", FOREIGN, base, before, read], capture_output=True, text=True,
                              timeout=60)

    got = run("theirs")
    assert got.returncode == -signal.SIGBUS and "about to read" in got.stdout and "read" not in got.stdout[14:]
    assert got.stderr.count("Fatal Python error: Bus error") == (before != "nothing"), got.stderr[-1500:]
    got = run("ours")
    assert got.returncode == 0 and "read 0 10" in got.stdout, (got.returncode, got.stdout, got.stderr[-1500:])
    killed = subprocess.run([sys.executable, "-c", "import os, signal; from shardfeed.formats.chunks import map_file; "
                             f"m = map_file({base + '.ours'!r}); os.kill(os.getpid(), signal.SIGBUS); print('survived')"],
                            capture_output=True, text=True, timeout=60)
    assert killed.returncode == -signal.SIGBUS and "survived" not in killed.stdout


LOST_FROM = r"""
import os, sys
from shardfeed.formats.chunks import map_file
a, b = sys.argv[1], sys.argv[2]
for p in (a, b):
    with open(p, "wb") as f:
        f.write(bytes(range(256)) * 4096)  # 1 MiB
ma, mb = map_file(a), map_file(b)
view = memoryview(ma)
assert ma.lost_from is None and view[300_000] == 300_000 % 256
os.truncate(a, 100_000)
assert bytes(view[500_000:500_004]) == b"\0\0\0\0"  # would have been SIGBUS
assert ma.lost_from == 100_000 and mb.lost_from is None, (ma.lost_from, mb.lost_from)
assert bytes(memoryview(mb)[500_000:500_002]) == bytes([500_000 % 256, 500_001 % 256])
print("ok")
"""


def test_a_map_says_from_where_it_lost_its_file(tmp_path):
    """``MappedFile.lost_from``: None while the file is whole; its new end once a page past
    it was read (as zeros); the maps of other files untouched."""
    got = subprocess.run([sys.executable, "-c", LOST_FROM, str(tmp_path / "a"), str(tmp_path / "b")],
                         capture_output=True, text=True, timeout=60)
    assert got.returncode == 0 and got.stdout.strip() == "ok", (got.returncode, got.stderr[-1500:])
