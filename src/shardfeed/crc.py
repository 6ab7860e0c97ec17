"""CRC-32C (Castagnoli) and the masked form TFRecord frames carry.

Uses the ``crc32c`` package (hardware CRC instruction, about 10 GB/s here) and falls back
to ``google_crc32c``, then to a table-driven pure-Python version with a warning.
"""

from __future__ import annotations

import logging
import struct

logger = logging.getLogger(__name__)

_MASK_DELTA = 0xA282EAD8

try:
    from crc32c import crc32c as _crc32c_impl  # type: ignore[import-not-found]

    CRC_BACKEND = "crc32c"
except ImportError:  # pragma: no cover - depends on the environment
    try:
        import google_crc32c  # type: ignore[import-not-found]

        def _crc32c_impl(data, value: int = 0) -> int:
            return google_crc32c.extend(value, bytes(data))

        CRC_BACKEND = "google-crc32c"
    except ImportError:
        _TABLE = []
        for _i in range(256):
            _c = _i
            for _ in range(8):
                _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
            _TABLE.append(_c)

        def _crc32c_impl(data, value: int = 0) -> int:
            crc = value ^ 0xFFFFFFFF
            for b in bytes(data):
                crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
            return crc ^ 0xFFFFFFFF

        CRC_BACKEND = "pure-python"
        logger.warning("no CRC-32C package installed (pip install crc32c); CRC checks will be slow")


def crc32c(data, value: int = 0) -> int:
    """CRC-32C of ``data`` (bytes-like), continuing from ``value``."""
    return _crc32c_impl(data, value)


def masked_crc32c(data) -> int:
    """TFRecord's masked CRC: rotate right by 15 bits and add a constant, mod 2**32."""
    crc = _crc32c_impl(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def masked_length_crc(length: int) -> int:
    """Masked CRC of a frame's 8-byte little-endian length field."""
    return masked_crc32c(struct.pack("<Q", length))
