"""The ``shardfeed`` command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import shardfeed as sf
from shardfeed.cli.main import main
from shardfeed.formats.index import read_index


@pytest.fixture
def shards(tmp_path):
    for s in range(2):
        sf.write_records(str(tmp_path / f"part-{s}.tfrecord"),
                         [sf.encode_example({"id": [s * 10 + i], "name": [f"n{i}".encode()], "x": [0.5] * (i % 3)})
                          for i in range(10)])
    return tmp_path


def test_head_prints_decoded_json_lines(shards, capsys):
    assert main(["head", "-n", "3", str(shards / "part-0.tfrecord")]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["id"] for line in lines] == [[0], [1], [2]]
    assert lines[1]["name"] == ["n1"] and lines[1]["x"] == [0.5]


def test_head_raw_and_across_files(shards, capsys):
    assert main(["head", "-n", "12", "--raw", str(shards / "*.tfrecord")]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 12 and lines[-1]["file"].endswith("part-1.tfrecord") and lines[-1]["index"] == 1


def test_count_total_and_per_file(shards, capsys):
    assert main(["count", "--json", str(shards)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["total"] == 20 and len(report["files"]) == 2


def test_verify_ok_then_corrupt_exits_nonzero_with_offsets(shards, capsys):
    assert main(["verify", str(shards / "*.tfrecord")]) == 0
    assert "OK: 20 good records" in capsys.readouterr().out
    path = shards / "part-1.tfrecord"
    data = bytearray(path.read_bytes())
    data[20] ^= 0x40  # inside the data of the first record
    path.write_bytes(bytes(data))
    assert main(["verify", "--json", str(shards / "*.tfrecord")]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["corrupt_records"] == 1 and report["records"] == 19
    assert report["errors"][0]["offset"] == 0 and report["errors"][0]["check"] == "data crc"
    assert report["errors"][0]["file"].endswith("part-1.tfrecord")


def test_index_writes_idx_files(shards, capsys):
    assert main(["index", "-q", str(shards / "*.tfrecord")]) == 0
    idx = read_index(str(shards / "part-0.tfrecord.idx"))
    assert len(idx) == 10
    # index files beside the shards are not mistaken for shards
    assert main(["count", str(shards)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "20"


def test_an_empty_index_suffix_is_refused_and_the_shard_kept(shards, capsys):
    """`shardfeed index --suffix ""` wrote each index over its shard: the records gone,
    exit 0 (found from outside)."""
    before = (shards / "part-0.tfrecord").read_bytes()
    assert main(["index", "--suffix", "", str(shards / "part-0.tfrecord")]) != 0
    assert "--suffix must not be empty" in capsys.readouterr().err
    assert (shards / "part-0.tfrecord").read_bytes() == before


@pytest.mark.parametrize("argv", [["head", "-n", "-1"], ["inspect", "--sample", "0"]])
def test_negative_counts_are_usage_errors(shards, argv, capsys):
    """`shardfeed head -n -1` printed nothing and exited 0 (found from outside)."""
    with pytest.raises(SystemExit) as info:
        main([*argv, str(shards)])
    assert info.value.code == 2 and "must be at least" in capsys.readouterr().err


def test_inspect_reports_kinds_and_suggests_specs(shards, capsys):
    assert main(["inspect", "--json", str(shards)]) == 0
    report = json.loads(capsys.readouterr().out)
    f = report["features"]
    assert f["id"]["kind"] == "int64_list" and f["id"]["suggested_spec"] == "FixedLen('int64')"
    assert f["x"]["suggested_spec"] == "VarLen('float32')" and f["x"]["max_len"] == 2


def test_missing_input_is_a_clear_error(tmp_path, capsys):
    assert main(["count", str(tmp_path / "nope-*.tfrecord")]) == 2
    err = capsys.readouterr().err
    assert "no files match" in err and "Traceback" not in err


def test_head_on_non_example_records_names_the_record(tmp_path, capsys):
    sf.write_records(str(tmp_path / "junk.tfrecord"), [b"\xff\xff\xff"])
    assert main(["head", str(tmp_path / "junk.tfrecord")]) == 2
    err = capsys.readouterr().err
    assert "record #0" in err and "junk.tfrecord" in err


def test_demo_converts_trains_and_charts(tmp_path, capsys):
    pytest.importorskip("PIL")
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--images", "240", "--epochs", "2"]) == 0
    text = capsys.readouterr().out
    assert "240 rows read, 240 records written, 0 discarded" in text
    assert "epoch 2: test accuracy" in text and "records/s" in text and "fed naively" in text
    assert "the pipeline's verdict: " in text and "each stage's own time" in text
    assert (out / "where-time-went.png").stat().st_size > 1000
    summary = json.loads((out / "summary.json").read_text())
    assert summary["verdict"] == summary["stats"]["verdict"] and summary["stats"]["remedy"]["id"]
    stages = {s["name"].split(":", 1)[-1] for s in summary["stats"]["stages"]}
    assert {"tfrecord", "batch", "map", "prefetch"} <= stages
    assert main(["verify", "-q", str(out / "shards")]) == 0
    assert "OK: 240 good records" in capsys.readouterr().out


@pytest.mark.slow  # several seconds: out of the quick loop (make test-fast)
def test_the_demo_is_not_input_bound_by_its_own_verdict(tmp_path, capsys):
    # the simulated accelerator step (the host CPU free meanwhile, as with a device) is
    # long here, so that the pipeline is far ahead of the trainer on any machine; the
    # verdict is the pipeline's own, from its own measurements. Four epochs (32 steps, about
    # 4.3 s): the start-up before the first batch is then a smaller share of the pass on a
    # loaded machine (1-2.5%, against the 10% that is input-bound)
    pytest.importorskip("PIL")
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--images", "320", "--epochs", "4", "--step-ms", "120"]) == 0
    text = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stats"]["input_bound"] is False, summary["verdict"]
    assert "the pipeline's verdict: not input-bound" in text
    assert summary["stats"]["remedy"]["id"] == "input_fast_enough"


def test_inspect_of_a_converted_folder_draws_samples(tmp_path, capsys):
    pytest.importorskip("PIL")
    from shardfeed.cli.demo import draw_shapes

    draw_shapes(str(tmp_path / "img"), 12)
    sf.convert(str(tmp_path / "img"), str(tmp_path / "shards"), progress=False)
    assert main(["inspect", str(tmp_path / "shards"), "--out", str(tmp_path / "look"), "--images", "3"]) == 0
    assert len(list((tmp_path / "look").glob("*.png")) + list((tmp_path / "look").glob("*.jpg"))) >= 3


def test_version_says_which_parser_is_active():
    out = subprocess.run([sys.executable, "-m", "shardfeed.cli.main", "--version"],
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith(f"shardfeed {sf.__version__} (")
    assert ("native" in out) == sf.native_available()


@pytest.mark.slow  # several seconds: out of the quick loop (make test-fast)
def test_verbose_logging_masks_secrets_from_every_library_and_vv_opens_them(tmp_path):
    import subprocess
    import sys

    script = (
        "import logging, sys\n"
        "from shardfeed.cli.main import configure_logging\n"
        "from shardfeed.storage import register_secret\n"
        "configure_logging(int(sys.argv[1]))\n"
        "register_secret('tok-SECRET-1234')\n"
        "logging.getLogger('botocore.endpoint').debug('GET https://b.s3/k?X-Amz-Signature=abcdef0123&x=1 %s',"
        " 'x-amz-security-token: tok-SECRET-1234')\n"
        "logging.getLogger('shardfeed.storage').debug('retry https://u:pw-SECRET@h/k?Signature=zzz9')\n"
        "try:\n"
        "    raise OSError('failed https://h/k?sig=SIGSECRET')\n"
        "except OSError:\n"
        "    logging.getLogger('fsspec').exception('boom')\n"
    )
    out = {}
    for v in (0, 1, 2):
        r = subprocess.run([sys.executable, "-c", script, str(v)], capture_output=True, text=True, timeout=60)
        out[v] = r.stderr
    for v, text in out.items():
        for secret in ("abcdef0123", "tok-SECRET-1234", "pw-SECRET", "zzz9", "SIGSECRET"):
            assert secret not in text, (v, text)
    assert "retry" not in out[0] and "retry" in out[1] and "botocore" not in out[1]  # -v: shardfeed only
    assert "botocore.endpoint" in out[2] and "X-Amz-Signature=***" in out[2]  # -vv: every library, masked
    assert "boom" in out[0] and "Traceback" in out[0]  # errors always, their tracebacks masked too


def test_commands_on_a_folder_read_its_record_files_and_say_what_they_skipped(shards, capsys):
    sf.write_records(str(shards / "part-2"), [sf.encode_example({"id": [99]})])  # no extension, as TF writes
    sf.write_records(str(shards / "part-3.tfrecord.gz"), [sf.encode_example({"id": [7]})] * 4)
    sf.build_index(str(shards / "part-0.tfrecord"))
    (shards / "schema.pbtxt").write_text('feature { name: "id" type: INT }\n')
    (shards / "manifest.json").write_text("{}")
    (shards / "discarded.csv").write_text("row,reason\n")
    (shards / "README").write_text("converted with shardfeed\n")
    assert main(["count", "--json", str(shards)]) == 0
    out = capsys.readouterr()
    report = json.loads(out.out)
    assert report["total"] == 10 + 10 + 1 + 4 and len(report["files"]) == 4
    assert "skipped 5 file(s) that are not TFRecords" in out.err
    for name in ("README", "schema.pbtxt", "manifest.json", "discarded.csv", "part-0.tfrecord.idx"):
        assert name in out.err
    assert main(["verify", str(shards)]) == 0
    assert "OK: 25 good records in 4 files" in capsys.readouterr().out
    assert main(["head", "-n", "30", str(shards)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 25
    # a file named explicitly is read as given, and a bad one is still an error
    assert main(["count", str(shards / "README")]) != 0


def test_a_record_file_damaged_from_its_first_bytes_is_corrupt_not_skipped(shards, capsys):
    # sniffing is for files without a record extension: a .tfrecord that fails it is corruption
    path = shards / "part-1.tfrecord"
    data = bytearray(path.read_bytes())
    data[0:12] = b"\xff" * 12  # the first frame's header: length and its CRC
    path.write_bytes(bytes(data))
    assert main(["verify", "--json", str(shards)]) == 1
    out = capsys.readouterr()
    report = json.loads(out.out)
    assert report["files"] == 2 and report["records"] == 19 and report["corrupt_records"] == 1  # resynced
    assert report["errors"][0]["file"].endswith("part-1.tfrecord") and report["errors"][0]["offset"] == 0
    assert "part-1.tfrecord" not in out.err  # not said to be "not a TFRecord" and left out
    assert main(["verify", str(shards / "*.tfrecord")]) == 1
    assert "CORRUPT (1 of 2 files)" in capsys.readouterr().out
    for command in (["count"], ["head", "-n", "30"]):  # the damaged file is an error, not left out
        assert main([*command, str(shards)]) == 2
        err = capsys.readouterr().err
        assert "part-1.tfrecord" in err and "offset 0" in err, err
    # the same bytes under a name with no record extension are sniffed and left out, as before
    os.replace(path, shards / "part-1")
    assert main(["verify", str(shards)]) == 0
    assert "skipped 1 file(s) that are not TFRecords: part-1" in capsys.readouterr().err


def test_commands_never_print_a_signed_urls_signature(shards, http_dir, capsys):
    directory, base = http_dir
    (directory / "p.tfrecord").write_bytes((shards / "part-0.tfrecord").read_bytes())
    url = f"{base}/p.tfrecord?X-Amz-Credential=cred-9f3e&X-Amz-Signature=sig-9f3e&x=1"
    for command in (["count", "--json"], ["count", "--per-file"], ["head", "-n", "1", "--raw"], ["verify", "--json"]):
        assert main([*command, url]) == 0
        out = capsys.readouterr()
        assert "9f3e" not in out.out + out.err and ("p.tfrecord" in out.out or "verify" in command), (command, out)
