"""Feature transforms: PAI-TF's CSV transforms (``trans_csv_*``), vectorized."""

from .csv import (
    csv_id2dense,
    csv_id2sparse,
    csv_kv2dense,
    csv_kv2sparse,
    csv_to_dense,
    sparse_to_dense,
    sparse_to_scipy,
    sparse_to_tf,
    sparse_to_torch,
    trans_csv_id2dense,
    trans_csv_id2sparse,
    trans_csv_kv2dense,
    trans_csv_kv2sparse,
    trans_csv_to_dense,
)

__all__ = [
    "csv_id2dense",
    "csv_id2sparse",
    "csv_kv2dense",
    "csv_kv2sparse",
    "csv_to_dense",
    "sparse_to_dense",
    "sparse_to_scipy",
    "sparse_to_tf",
    "sparse_to_torch",
    "trans_csv_id2dense",
    "trans_csv_id2sparse",
    "trans_csv_kv2dense",
    "trans_csv_kv2sparse",
    "trans_csv_to_dense",
]
