"""TensorBoard scalars: the one writer behind ``Statistics.write_tensorboard`` and
``WorkQueue.add_summary``.

TensorFlow (and the ``tensorboard`` package it depends on) are optional and imported only
here, when a scalar is written. Scalars go through ``tf.summary.write`` with the scalars
plugin's metadata: the records ``tf.summary.scalar`` writes, read by TensorBoard alike.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger(__name__)


def write_scalars(scalars: Mapping[str, float], step: int, logdir: str | None = None, writer: Any = None,
                  what: str = "TensorBoard scalars", missing_level: int = logging.INFO) -> bool:
    """Write ``scalars`` (tag -> number) at ``step``: to a new event file in ``logdir``
    (flushed and closed before returning), or through ``writer`` (a ``tf.summary`` writer,
    left open), or to the default ``tf.summary`` writer when neither is given.

    Returns ``False``, writing nothing, when TensorFlow or TensorBoard is not installed (a
    log record at ``missing_level`` names ``what`` was skipped); ``True`` otherwise."""
    try:
        import tensorboard  # noqa: F401, PLC0415 - the scalars are for TensorBoard; tensorflow depends on it
        import tensorflow as tf  # noqa: PLC0415 - optional, heavy
        from tensorflow.core.framework import summary_pb2  # noqa: PLC0415
    except ImportError:
        logger.log(missing_level, "TensorFlow or TensorBoard is not installed; %s not written", what)
        return False
    meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
    own = tf.summary.create_file_writer(logdir) if writer is None and logdir is not None else None
    target = own if own is not None else writer
    ctx = target.as_default() if target is not None else None
    if ctx is not None:
        ctx.__enter__()
    try:
        for tag, value in scalars.items():
            tf.summary.write(tag, tf.constant(float(value), tf.float32), step=int(step), metadata=meta)
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
        if own is not None:
            own.flush()
            own.close()
    return True


__all__ = ["write_scalars"]
