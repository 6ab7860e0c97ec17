"""The pandas accessor ``df.shardfeed.to_tfrecord(output_dir, ...)``.

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


def register() -> None:
    """Register ``df.shardfeed`` with pandas (imports pandas; idempotent)."""
    global _registered
    if _registered:
        return
    import warnings

    from pandas.api.extensions import register_dataframe_accessor

    with warnings.catch_warnings():  # re-registering after a reload warns; harmless
        warnings.simplefilter("ignore", UserWarning)
        register_dataframe_accessor(ACCESSOR)(ShardfeedAccessor)
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
    """Make ``df.shardfeed`` available whenever pandas is (without importing pandas now)."""
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
