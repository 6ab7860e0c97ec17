"""CRC-32C for TFRecord framing: :mod:`shardfeed.crc`, named here where the formats use it
(the storage layer checks cached copies with the same code, so it lives below both)."""

from ..crc import CRC_BACKEND, crc32c, masked_crc32c, masked_length_crc

__all__ = ["CRC_BACKEND", "crc32c", "masked_crc32c", "masked_length_crc"]
