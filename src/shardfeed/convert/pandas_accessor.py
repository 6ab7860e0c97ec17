"""The pandas accessor ``df.shardfeed.to_tfrecord(output_dir, ...)``, and TFRecorder's
name for it, ``df.tensorflow.to_tfrecord(output_dir=...)`` / ``to_tfr``, registered only
when TFRecorder is not installed and no ``tensorflow`` accessor exists.

``install()`` (called when shardfeed is imported) never imports pandas itself: if pandas
is already imported the accessor is registered at once; if pandas is installed but not
yet imported, a one-shot import hook registers it right after ``import pandas``
finishes; if pandas is not installed nothing happens.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
from typing import Any

logger = logging.getLogger(__name__)

ACCESSOR = "shardfeed"
_registered = False


class ShardfeedAccessor:
    """``df.shardfeed``: conversion of the DataFrame to sharded TFRecords."""

    def __init__(self, df: Any):
        self._df = df

    def to_tfrecord(self, output_dir: str, **kwargs: Any):
        """``shardfeed.convert(df, output_dir, **kwargs)``: AutoML layout
        ``split,image_uri,label`` unless ``schema=`` says otherwise. Returns the
        :class:`~shardfeed.convert.api.ConvertResult`."""
        from .api import convert

        return convert(self._df, output_dir, **kwargs)


TFRECORDER_ACCESSOR = "tensorflow"
_DIRECT = ("directrunner", "local")


def tfrecorder_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """TFRecorder's ``to_tfr`` keywords as :func:`~shardfeed.convert` options:
    ``runner="DirectRunner"`` -> the local runner; another Beam runner (``DataflowRunner``,
    any case) -> ``runner="beam", beam_runner=...``, with ``project``, ``region`` and
    ``dataflow_options`` as ``beam_options``; ``compression="gzip"`` -> ``"GZIP"``;
    ``num_shards=0`` (Beam's choice) -> the default shard size; ``job_label`` is dropped
    (shardfeed writes into ``output_dir`` itself, not into a job folder). Other keywords
    pass through. Raises ``ValueError`` for ``num_shards`` > 0, ``schema_map`` and
    ``tfrecorder_wheel``, saying what to give instead."""
    kw = dict(kwargs)
    if kw.pop("num_shards", 0):
        raise ValueError("num_shards is TFRecorder's; shardfeed cuts shards by rows: give "
                         "num_samples_per_tfrecord= (rows per shard) instead")
    if "schema_map" in kw:
        raise ValueError("schema_map is TFRecorder's; give schema= with shardfeed's column types "
                         "(e.g. {'split': 'split', 'image_uri': 'image_uri', 'label': 'string label'})")
    if kw.pop("tfrecorder_wheel", None):
        raise ValueError("tfrecorder_wheel is TFRecorder's; give the workers shardfeed through "
                         "beam_options={'extra_packages': [...]} or a container image")
    kw.pop("job_label", None)
    beam_options = dict(kw.pop("beam_options", None) or {})
    for name in ("project", "region"):
        if kw.get(name) is not None:
            beam_options[name] = kw.pop(name)
        kw.pop(name, None)
    beam_options.update(kw.pop("dataflow_options", None) or {})
    runner = kw.pop("runner", None)
    if runner is not None and str(runner).lower() not in _DIRECT and runner != "beam":
        kw["runner"], kw["beam_runner"] = "beam", ("DataflowRunner" if str(runner).lower() == "dataflowrunner"
                                                   else runner)
    elif runner is not None:
        kw["runner"] = "beam" if runner == "beam" else "local"
    if beam_options:
        kw["beam_options"] = beam_options
    if isinstance(kw.get("compression"), str):
        kw["compression"] = None if kw["compression"].lower() in ("", "none") else kw["compression"].upper()
    return kw


class TFRecorderAccessor(ShardfeedAccessor):
    """``df.tensorflow``: TFRecorder's accessor name for :class:`ShardfeedAccessor`, so
    ``df.tensorflow.to_tfrecord(output_dir="gs://my/bucket")`` runs as written. TFRecorder's
    keywords are translated (:func:`tfrecorder_options`); the output is shardfeed's
    (manifest, ``sf.read_dataset``), not TFRecorder's job folder."""

    def to_tfrecord(self, output_dir: str, **kwargs: Any):
        """``shardfeed.convert(df, output_dir, **options)`` with TFRecorder's keywords
        translated. Returns the :class:`~shardfeed.convert.api.ConvertResult`."""
        return super().to_tfrecord(output_dir, **tfrecorder_options(kwargs))

    to_tfr = to_tfrecord


def _tensorflow_name_free(pd_frame: Any) -> bool:
    try:
        if importlib.util.find_spec("tfrecorder") is not None:
            return False  # TFRecorder registers df.tensorflow when imported
    except (ImportError, ValueError):
        pass
    return TFRECORDER_ACCESSOR not in getattr(pd_frame, "_accessors", set()) and not hasattr(pd_frame,
                                                                                              TFRECORDER_ACCESSOR)


def register() -> None:
    """Register ``df.shardfeed`` with pandas (imports pandas; idempotent), and
    ``df.tensorflow`` when that name is free and TFRecorder is not installed."""
    global _registered
    if _registered:
        return
    import warnings

    from pandas import DataFrame
    from pandas.api.extensions import register_dataframe_accessor

    with warnings.catch_warnings():  # re-registering after a reload warns; harmless
        warnings.simplefilter("ignore", UserWarning)
        register_dataframe_accessor(ACCESSOR)(ShardfeedAccessor)
        if _tensorflow_name_free(DataFrame):
            register_dataframe_accessor(TFRECORDER_ACCESSOR)(TFRecorderAccessor)
    _registered = True


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        try:
            register()
        except Exception:  # a broken pandas install must not break `import pandas`
            logger.debug("could not register the df.shardfeed accessor", exc_info=True)


class _PandasImportHook(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != "pandas":
            return None
        _remove_hook()
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def _remove_hook() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _PandasImportHook)]


def install() -> None:
    """Make ``df.shardfeed`` (and, where free, ``df.tensorflow``) available whenever
    pandas is (without importing pandas now)."""
    if _registered:
        return
    if "pandas" in sys.modules:
        try:
            register()
        except Exception:  # a partly imported or broken pandas: no accessor
            logger.debug("could not register the df.shardfeed accessor", exc_info=True)
        return
    if any(isinstance(f, _PandasImportHook) for f in sys.meta_path):
        return
    try:
        installed = importlib.util.find_spec("pandas") is not None
    except (ImportError, ValueError):
        installed = False
    if installed:
        sys.meta_path.insert(0, _PandasImportHook())
