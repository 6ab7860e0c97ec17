"""``shardfeed convert``: tables, folders and annotation files to sharded TFRecords; and
``inspect_output``, what ``shardfeed inspect`` does for a converted output folder.

Option names are PAI's (``--max_image_size``); the dashed spelling works too
(``--max-image-size``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..formats.image_damage import MAX_IMAGE_PIXELS
from ..storage.urls import mask

_ANNOTATION_TYPES = ("DETECTION", "SEGMENTATION", "INSTANCE_SEGMENTATION", "TEXT_RECOGNITION", "TEXT_DETECTION",
                     "TEXT_END2END", "VIDEO_CLASSIFICATION")


def _opt(sp: argparse.ArgumentParser, name: str, **kw: Any) -> None:
    flags = [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])
    sp.add_argument(*flags, dest=name, **kw)


def _looks_like_pai_annotations(url: str) -> bool:
    """A PAI annotation CSV (``id, raw JSON, answer JSON``) rather than a table: the first
    row's second and third fields are JSON objects."""
    import csv  # noqa: PLC0415
    import io  # noqa: PLC0415

    from .. import storage  # noqa: PLC0415

    if url.lower().rstrip("/").endswith((".parquet", ".pq", ".parq", ".jsonl", ".ndjson", ".json")):
        return False  # tables Spark and pandas write; a PAI annotation file is a CSV
    try:
        raw = storage.read_bytes(url, 0, 64 << 10)
    except (OSError, ValueError):
        return False  # a folder, or unreadable: convert() says what is wrong
    if raw.startswith(b"PAR1") or b"\0" in raw:
        return False  # Parquet (or another binary file) is not an annotation CSV
    head = raw.decode("utf-8", errors="replace")
    rows = [r for r in csv.reader(io.StringIO(head)) if r][:3]  # the first may be PAI's header row
    return any(len(r) >= 3 and r[1].lstrip().startswith("{") and r[2].lstrip().startswith(("{", "[")) for r in rows)


def _key_values(items: list[str] | None, what: str) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{what} takes KEY=VALUE, got {item!r}")
        out[key.strip()] = value
    return out


def _schema(text: str | None) -> dict[str, str] | None:
    """``col:type,col:type`` or a JSON object (or ``@file.json``)."""
    if not text:
        return None
    if text.startswith("@"):
        with open(text[1:], encoding="utf-8") as f:
            text = f.read()
    if text.lstrip().startswith("{"):
        return dict(json.loads(text))
    out = {}
    for part in text.split(","):
        col, sep, t = part.rpartition(":")
        if not sep:
            raise ValueError(f"--schema takes column:type pairs separated by commas, got {part!r}")
        out[col.strip()] = t.strip()
    return out


def _beam_value(v: str) -> Any:
    try:
        return json.loads(v)
    except ValueError:
        return v


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``convert`` subcommand to ``subparsers`` (from ``add_subparsers``)."""
    sp = subparsers.add_parser(
        "convert", help="convert a CSV, an image folder or an annotation file to sharded TFRecords",
        description="Convert a CSV (split,image_uri,label or --schema), an image folder, a PAI annotation "
                    "CSV or an iTAG .manifest (of images, or of videos for VIDEO_CLASSIFICATION) to sharded, "
                    "indexed TFRecords with a manifest and a discard report. Bad rows (and unreadable or "
                    "truncated videos) are reported, never fatal.")
    sp.add_argument("input", help="CSV, image folder, annotation CSV or .manifest (any storage URL)")
    sp.add_argument("output", help="output folder (any storage URL)")
    sp.add_argument("--annotations", action="store_true",
                    help="the input is a PAI annotation CSV or iTAG manifest (implied by .manifest and by "
                         "model types other than CLASSIFICATION)")
    _opt(sp, "model_type", default="CLASSIFICATION", type=str.upper,
         help="CLASSIFICATION, DETECTION, SEGMENTATION, INSTANCE_SEGMENTATION (polygons to PNG instance masks), "
              "TEXT_RECOGNITION, TEXT_DETECTION, TEXT_END2END, VIDEO_CLASSIFICATION (videos to clips of JPEG "
              "frames; needs shardfeed[video]), SELF_DEFINED")
    sp.add_argument("--schema", help="column types: 'col:type,col:type' (types: split, image_uri, int, float, "
                                     "string, int list, float list, string list, integer label, string label), "
                                     "a JSON object, or @file.json")
    sp.add_argument("--default", action="append", metavar="COLUMN=VALUE", help="default for missing cells")
    _opt(sp, "class_list_file", help="class list: 'name' or 'name:mapped' per line")
    for name in ("default_class", "error_class", "ignore_class"):
        _opt(sp, name)
    _opt(sp, "test_ratio", type=float, default=0.0, help="share of rows without a split that go to test")
    sp.add_argument("--seed", type=int, default=0, help="seed of the test_ratio split (default 0)")
    _opt(sp, "split_key", help="column whose value decides a row's test_ratio split (default: the row's content)")
    _opt(sp, "max_image_size", type=int, help="longest side in pixels (never upscaled)")
    _opt(sp, "max_test_image_size", type=int, help="the same for validation/test (default max_image_size)")
    _opt(sp, "image_format", default="jpg", choices=["jpg", "jpeg", "png"])
    _opt(sp, "image_check", default="header", choices=["header", "decode"],
         help="how images stored as they are get verified: 'header' (default) walks the JPEG markers / PNG "
              "chunks and CRCs without decoding; 'decode' decodes each fully (slower; also catches damage "
              "inside the compressed data)")
    _opt(sp, "jpeg_quality", type=int, default=90)
    _opt(sp, "max_image_pixels", type=int, default=MAX_IMAGE_PIXELS, help="decompression-bomb limit (pixels)")
    _opt(sp, "read_parallel_num", type=int, default=2, help="conversion workers (default 2)")
    _opt(sp, "write_parallel_num", type=int, default=1, help="shard committers (default 1)")
    _opt(sp, "num_samples_per_tfrecord", type=int, default=256, help="input rows per shard (default 256)")
    _opt(sp, "bytes_per_tfrecord", type=int, help="about how many bytes a shard holds: fewer rows per shard, "
         "sized from a sample of converted rows (default: rows only)")
    sp.add_argument("--compression", default=None, help="none (default; shards get .idx index files) or GZIP")
    _opt(sp, "output_prefix", default="data", help="shard name prefix (default 'data')")
    _opt(sp, "char_replace_map_path")
    _opt(sp, "default_char_dict_path")
    _opt(sp, "converter_class", help="SELF_DEFINED: 'package.module:Class' or a shardfeed.converters entry point")
    _opt(sp, "converter_option", action="append", metavar="KEY=VALUE", help="option passed to the user converter")
    video = sp.add_argument_group("VIDEO_CLASSIFICATION (PAI's video options)")
    _opt(video, "decode_type", type=int, default=4, choices=[1, 2, 3, 4],
         help="frames decoded: 1 intra only, 2 key frames only, 3 without bidirectional (B) frames, "
              "4 all (default 4)")
    _opt(video, "sample_fps", type=float, default=5.0, help="frames kept per second of video (default 5)")
    _opt(video, "reshape_size", type=int, default=224,
         help="shorter side of the stored frames in pixels, aspect kept (default 224; 0 keeps the decoded size)")
    _opt(video, "decode_batch_size", type=int, default=10, help="frames per clip, one record per clip (default 10)")
    _opt(video, "decode_keep_size", type=int, default=0,
         help="frames a clip shares with the previous one (default 0)")
    sp.add_argument("--executor", choices=["thread", "process"], default="thread")
    sp.add_argument("--runner", choices=["local", "beam", "spark", "ray"], default="local",
                    help="local (threads/processes here), beam, spark (executors read, convert and write), or "
                         "ray (a Ray task a shard)")
    _opt(sp, "spark_master", help="Spark master URL for --runner spark (default: the running session under "
                                  "spark-submit, else local[*]), e.g. spark://host:7077, yarn, local-cluster[2,1,1024]")
    _opt(sp, "beam_runner", help="Beam runner (default DirectRunner)")
    _opt(sp, "beam_option", action="append", metavar="KEY=VALUE",
         help="Beam pipeline option, e.g. direct_num_workers=2 (values parsed as JSON when they are)")
    sp.add_argument("--resume", action="store_true", help="keep shards a previous run of the same job finished")
    sp.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    sp.add_argument("--json", action="store_true", help="print the manifest counts as JSON")
    sp.set_defaults(func=cmd_convert)
    return sp


def cmd_convert(args: argparse.Namespace) -> int:
    from ..convert import convert, convert_annotations
    from ..convert.schema import Schema, parse_cell

    schema = _schema(args.schema)
    defaults: dict[str, Any] = _key_values(args.default, "--default")
    if defaults:
        if schema is None:
            raise ValueError("--default needs --schema (it names schema columns)")
        typed = Schema(schema)
        defaults = {c: parse_cell(typed, c, v) for c, v in defaults.items()}
    compression = None if args.compression in (None, "", "none", "NONE") else args.compression
    common: dict[str, Any] = dict(
        class_list_file=args.class_list_file, default_class=args.default_class, error_class=args.error_class,
        ignore_class=args.ignore_class, test_ratio=args.test_ratio, seed=args.seed, split_key=args.split_key,
        max_image_size=args.max_image_size, max_test_image_size=args.max_test_image_size,
        image_format=args.image_format, image_check=args.image_check, jpeg_quality=args.jpeg_quality,
        max_image_pixels=args.max_image_pixels,
        read_parallel_num=args.read_parallel_num,
        write_parallel_num=args.write_parallel_num, num_samples_per_tfrecord=args.num_samples_per_tfrecord,
        bytes_per_tfrecord=args.bytes_per_tfrecord,
        compression=compression, prefix=args.output_prefix, char_replace_map_path=args.char_replace_map_path,
        default_char_dict_path=args.default_char_dict_path, converter_class=args.converter_class,
        converter_options={k: _beam_value(v)
                           for k, v in _key_values(args.converter_option, "--converter_option").items()},
        decode_type=args.decode_type, sample_fps=args.sample_fps, reshape_size=args.reshape_size or None,
        decode_batch_size=args.decode_batch_size, decode_keep_size=args.decode_keep_size,
        executor=args.executor, runner=args.runner, resume=args.resume, progress=not args.quiet,
        beam_runner=args.beam_runner, spark_master=args.spark_master,
        beam_options={k: _beam_value(v) for k, v in _key_values(args.beam_option, "--beam_option").items()} or None,
    )
    annotated = (args.annotations or args.model_type in _ANNOTATION_TYPES
                 or args.input.lower().endswith(".manifest") or _looks_like_pai_annotations(args.input))
    if annotated:
        if schema is not None:
            raise ValueError("--schema applies to tables, not to annotation files")
        result = convert_annotations(args.input, args.output, model_type=args.model_type, **common)
    else:
        result = convert(args.input, args.output, schema=schema, defaults=defaults or None,
                         model_type=args.model_type, **common)
    if args.json:
        print(json.dumps({"output": mask(args.output), **result.manifest["counts"],
                          "splits": {k: v["records"] for k, v in result.splits.items()}}))
    else:
        print(result)
        print(f"manifest: {mask(result.manifest_url)}")
        if result.rows_discarded:
            print(f"discard report ({result.rows_discarded} rows): {mask(result.discards_url)}")
    return 0


def inspect_output(output_dir: str, out: str = "inspect-out", n: int = 8, split: str | None = None,
                   as_json: bool = False, sample: int = 1000) -> int:
    """``shardfeed inspect DIR`` for a converted output folder: writes ``n`` decoded sample
    images per split (boxes, polygons and masks drawn) and ``samples.csv`` into ``out``,
    prints a summary; returns the exit code. For TFRecorder's output the summary has the
    records per split, the schema of ``sample`` records and the label vocabulary."""
    from ..convert.inspect import inspect_output as _inspect

    summary = _inspect(output_dir, out, n=n, split=split, sample=sample)
    if as_json:
        print(json.dumps(summary, ensure_ascii=False))
        return 0
    if summary.get("layout") == "tfrecorder":
        from ..formats.inspect import feature_table

        tft = "with" if summary["transform_fn"] else "without"
        print(f"{mask(summary['root'])}: TFRecorder output ({tft} tf.Transform's transform_fn); records per split: "
              + ", ".join(f"{k}={v}" for k, v in summary["splits"].items()))
        if summary["labels"]:
            print("labels: " + ", ".join(summary["labels"]) + " (label ids 0.." + str(len(summary["labels"]) - 1) + ")")
        print(f"schema of {summary['schema']['records']} sampled records (image: base64 of raw pixels; "
              f"read_dataset decodes it to height x width x channels uint8):")
        for line in feature_table(summary["schema"]):
            print("  " + line)
        print(f"wrote {len(summary['images'])} sample images and {summary['csv']} ({summary['samples']} rows) to {out}")
        return 0
    c = summary["counts"]
    print(f"{mask(output_dir)}: {c['rows_read']} rows read, {c['records_written']} records written, "
          f"{c['rows_discarded']} discarded; records per split: "
          + ", ".join(f"{k}={v}" for k, v in summary["splits"].items()))
    print(f"wrote {len(summary['images'])} sample images and {summary['csv']} ({summary['samples']} rows) to {out}")
    return 0


def is_converted_output(url: str) -> bool:
    """Whether ``shardfeed inspect`` should treat ``url`` as a converted output folder."""
    from ..convert.inspect import is_converted_output as _is

    return _is(url)


def main(argv: list[str] | None = None) -> int:
    """Run ``convert`` alone (for tests and before it is wired into ``shardfeed``)."""
    p = argparse.ArgumentParser(prog="shardfeed")
    sub = p.add_subparsers(dest="command", required=True)
    register(sub)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
