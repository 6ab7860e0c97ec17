"""``tf.train.Example`` / ``SequenceExample`` codec and batch parser, in pure Python:
decoding in :mod:`.example_decode`, encoding in :mod:`.example_encode`, batch parsing
against a spec in :mod:`.example_parse`; this module names them all.

This is the reference implementation: the native parser must give the same values and
the same accept/reject decisions. It needs neither ``protobuf`` nor TensorFlow.

Messages (tensorflow/core/example/{example,feature}.proto)::

    Example         { Features features = 1; }
    SequenceExample { Features context = 1; FeatureLists feature_lists = 2; }
    Features        { map<string, Feature> feature = 1; }      // entry: key = 1, value = 2
    FeatureLists    { map<string, FeatureList> feature_list = 1; }
    FeatureList     { repeated Feature feature = 1; }
    Feature         { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                                   Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }  FloatList { repeated float value = 1 [packed]; }
    Int64List { repeated int64 value = 1 [packed]; }

Decoding follows protobuf exactly (checked against it in tests/test_example.py):

- Fields may come in any order; unknown fields (any wire type, groups included) are
  skipped at every level; a known field number with an unexpected wire type is an unknown
  field. Wire-level errors are those of :mod:`shardfeed.formats.wire`.
- Repeated scalars: int64 values may be packed (wire type 2) or not (0), floats packed (2)
  or not (5), mixed freely and split in any number of chunks; values concatenate in order.
- A singular message field that appears more than once is merged: ``Example.features``
  twice merges the two maps; a map entry's ``value`` twice merges the two Features.
- Map entries: a missing key is ``""``, a missing value an empty Feature, a key given
  twice in one entry takes the last. A key that appears in several entries takes the last
  entry, whole (no merge). Unknown fields inside an entry are skipped and the entry kept
  (protobuf C++ and the pure-Python protobuf do this; upb alone drops such an entry).
  Keys must be valid UTF-8 (proto3 ``string``), else DecodeError.
- Feature ``kind`` is a oneof: a list field of another kind than the current one replaces
  it; the same kind again merges (values concatenate). So int64, bytes, int64 keeps only
  the last int64 list.
- An empty Feature (no kind set) decodes to ``[]``, an untyped empty list.
  ``tf.io.parse_example`` treats such a feature as *absent* (FixedLen uses the default or
  fails as missing; VarLen/Sparse get no values), and so does :func:`parse_example`.

TensorFlow's own fast parser is stricter/looser on some legal but non-canonical encodings
(it errors on a Feature whose first field is unknown, on mixed packed/unpacked lists and
on unknown fields in lists and entries, and keeps the *first* list when a Feature holds
two); records written by protobuf or by :func:`encode_example` parse identically in both.

Batch parsing (:func:`parse_example`) matches ``tf.io.parse_example``:

- FixedLen: the feature must hold exactly ``prod(shape)`` values of the spec's kind; an
  absent (or empty-kind) feature takes ``default`` (a scalar is broadcast, anything else
  must have ``prod(shape)`` elements and is reshaped, as TF reshapes it), else ParseError.
  A list of another kind is a ParseError even when empty, as in TF.
- VarLen: any number of values of the spec's kind; absent means none.
- FixedLenSequence (``allow_missing=True`` required): a multiple of ``prod(shape)``
  values, absent means length 0; the batch is padded to its longest record with the
  spec's scalar default (0 or ``b""`` without one), shape ``(n, longest, *shape)``.
- Sparse: per record, every index feature (int64) and the value feature must have the same
  number of values; indices must be in ``[0, size)`` (TF does not check and builds an
  invalid SparseTensor; we raise ParseError). Entries are sorted row-major by
  ``(record, index...)`` with a stable sort unless ``already_sorted``, as TF does.
- Features not in the spec are ignored but must be well formed. Every value array
  returned is a fresh, writable array.
"""

from __future__ import annotations

from .example_decode import decode_example, decode_sequence_example
from .example_encode import encode_example, encode_sequence_example, example_pieces, features_entries
from .example_parse import parse_example, parse_single_example

__all__ = [
    "decode_example", "encode_example", "example_pieces", "features_entries", "decode_sequence_example",
    "encode_sequence_example",
    "parse_example", "parse_single_example",
]
