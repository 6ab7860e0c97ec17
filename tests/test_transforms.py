"""The CSV feature transforms, checked against the source document's own examples."""

from __future__ import annotations

import numpy as np
import pytest

from shardfeed.transforms import (
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

KV = ["1:0.1,2:0.2,4:0.4,10:1.0", "0:0.22,3:0.33,9:0.99", "2:0.24,7:0.84,8:0.96"]


def test_id2sparse_matches_document_example():
    sp = trans_csv_id2sparse(["2,10", "7", "0,8"], 20)
    assert sp.indices.tolist() == [[0, 2], [0, 10], [1, 7], [2, 0], [2, 8]]
    assert sp.values.tolist() == [2, 10, 7, 0, 8]
    assert sp.values.dtype == np.int64
    assert sp.dense_shape.tolist() == [3, 20]


def test_id2sparse_without_id_as_value_puts_ones():
    sp = csv_id2sparse(["2,10", "7"], 20, id_as_value=False)
    assert sp.values.tolist() == [1, 1, 1]


def test_id2dense_matches_document_example():
    out = trans_csv_id2dense(["2,10", "7", "0,8"], 12)
    assert out.dtype == np.int64
    assert out.tolist() == [[0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0],
                            [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0],
                            [1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]]


def test_id2dense_with_id_as_value_puts_ids():
    assert csv_id2dense(["2,3"], 4, id_as_value=True).tolist() == [[0, 0, 2, 3]]


def test_kv2sparse_matches_document_example():
    sp = trans_csv_kv2sparse(KV, 20)
    # The document prints [2, 0] for the third row's first item, but that row's input is
    # "2:0.24,...": its key is 2 (a typo in the document's output; values and shape agree).
    assert sp.indices.tolist() == [[0, 1], [0, 2], [0, 4], [0, 10], [1, 0], [1, 3], [1, 9], [2, 2], [2, 7], [2, 8]]
    np.testing.assert_allclose(sp.values, [0.1, 0.2, 0.4, 1.0, 0.22, 0.33, 0.99, 0.24, 0.84, 0.96], rtol=1e-6)
    assert sp.values.dtype == np.float32
    assert sp.dense_shape.tolist() == [3, 20]


def test_kv2dense_matches_document_example():
    out = trans_csv_kv2dense(KV, 12)
    expected = np.zeros((3, 12), np.float32)
    for r, rec in enumerate(KV):
        for item in rec.split(","):
            k, v = item.split(":")
            expected[r, int(k)] = float(v)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, expected)


def test_to_dense_matches_document_example():
    out = trans_csv_to_dense(["0.1,0.2,0.4,1.0", "0.22,0.33,0.99", "0.24,0.84,0.96"], 6)
    np.testing.assert_allclose(out, [[0.1, 0.2, 0.4, 1.0, 0.0, 0.0], [0.22, 0.33, 0.99, 0.0, 0.0, 0.0],
                                     [0.24, 0.84, 0.96, 0.0, 0.0, 0.0]], rtol=1e-6)
    assert out.dtype == np.float32


def test_to_dense_row_filling_all_columns_is_accepted_and_longer_row_is_an_error():
    assert csv_to_dense(["1,2,3"], 3).tolist() == [[1, 2, 3]]
    with pytest.raises(ValueError, match=r"row 1: 4 values do not fit in max_id=3"):
        csv_to_dense(["1", "1,2,3,4"], 3)


@pytest.mark.parametrize("fn", [csv_id2sparse, csv_id2dense])
def test_id_out_of_range_is_an_error_naming_row(fn):
    with pytest.raises(ValueError, match=r"row 1: id 20 is out of range \[0, 20\)"):
        fn(["1", "3,20"], 20)
    with pytest.raises(ValueError, match=r"row 0: id -1 is out of range"):
        fn(["-1"], 20)


@pytest.mark.parametrize("fn", [csv_kv2sparse, csv_kv2dense])
def test_kv_key_out_of_range_and_malformed_items_are_errors(fn):
    with pytest.raises(ValueError, match=r"row 0: id 12 is out of range"):
        fn(["12:0.5"], 12)
    with pytest.raises(ValueError, match=r"row 1: item '3' is not key:value"):
        fn(["1:0.5", "3"], 12)
    with pytest.raises(ValueError, match=r"row 0: item '1:2:3' is not key:value"):
        fn(["1:2:3"], 12)
    with pytest.raises(ValueError, match=r"row 0: value 'x' is not a valid number"):
        fn(["1:x"], 12)


def test_non_integer_id_is_an_error_naming_row_and_token():
    with pytest.raises(ValueError, match=r"row 2: id '1.5' is not a valid number"):
        csv_id2sparse(["1", "2", "1.5"], 10)
    with pytest.raises(ValueError, match=r"row 0: id '' is not a valid number"):
        csv_id2sparse(["1,,2"], 10)


@pytest.mark.parametrize("delim", ["1", "+", "-", "e", "E", ".", "；", "ab", "é"])
def test_forbidden_field_delims_are_rejected(delim):
    with pytest.raises(ValueError, match="field_delim"):
        csv_id2sparse(["1"], 10, field_delim=delim)


def test_colon_delimiter_is_rejected_for_key_value_records():
    with pytest.raises(ValueError, match="':'"):
        csv_kv2dense(["1:2"], 10, field_delim=":")


def test_run_of_spaces_counts_as_one_delimiter():
    assert csv_id2dense(["  2   5 ", "1"], 6, field_delim=" ").tolist() == [[0, 0, 1, 0, 0, 1], [0, 1, 0, 0, 0, 0]]
    np.testing.assert_allclose(csv_to_dense(["0.5    1.5"], 3, field_delim=" "), [[0.5, 1.5, 0.0]])
    sp = csv_kv2sparse(["1:0.5   3:1.5"], 5, field_delim=" ")
    assert sp.indices.tolist() == [[0, 1], [0, 3]]


def test_other_delimiters_and_bytes_records():
    assert csv_id2dense([b"1;3", b""], 4, field_delim=";").tolist() == [[0, 1, 0, 1], [0, 0, 0, 0]]
    assert csv_id2dense(np.array(["1|2"]), 3, field_delim="|").tolist() == [[0, 1, 1]]


def test_empty_records_and_empty_batch():
    sp = csv_id2sparse(["", "3"], 5)
    assert sp.indices.tolist() == [[1, 3]] and sp.dense_shape.tolist() == [2, 5]
    empty = csv_kv2sparse([], 5)
    assert empty.indices.shape == (0, 2) and empty.dense_shape.tolist() == [0, 5]
    assert csv_to_dense([], 3).shape == (0, 3)


def test_unsorted_ids_give_row_major_sparse_indices():
    sp = csv_id2sparse(["9,1,4"], 10)
    assert sp.indices.tolist() == [[0, 1], [0, 4], [0, 9]] and sp.values.tolist() == [1, 4, 9]


def test_single_string_and_bad_max_id_are_rejected():
    with pytest.raises(TypeError, match="wrap it in a list"):
        csv_id2sparse("1,2", 10)
    with pytest.raises(ValueError, match="max_id must be a positive int"):
        csv_id2sparse(["1"], 0)


def test_sparse_outputs_convert_to_scipy_torch_tf_and_dense():
    sp = csv_kv2sparse(KV, 12)
    dense = csv_kv2dense(KV, 12)
    np.testing.assert_array_equal(sparse_to_dense(sp), dense)
    torch = pytest.importorskip("torch")
    np.testing.assert_array_equal(sparse_to_torch(sp).to_dense().numpy(), dense)
    assert isinstance(sparse_to_torch(sp), torch.Tensor)
    scipy = pytest.importorskip("scipy")
    assert scipy is not None
    np.testing.assert_array_equal(sparse_to_scipy(sp).toarray(), dense)


@pytest.mark.tf
def test_sparse_output_converts_to_tf_sparse_tensor():
    tf = pytest.importorskip("tensorflow")
    sp = csv_id2sparse(["2,10", "7", "0,8"], 20)
    t = sparse_to_tf(sp)
    np.testing.assert_array_equal(tf.sparse.to_dense(t).numpy(), sparse_to_dense(sp))


# -- found from outside (the ninth round) -------------------------------------------------------
@pytest.mark.parametrize("fn", [csv_id2sparse, csv_id2dense, csv_kv2sparse, csv_kv2dense])
def test_an_id_or_key_past_int64_is_an_error_naming_the_row(fn):
    """An id past int64 gave 'cannot parse ids', naming no row (Python's int took it)."""
    big = "99999999999999999999"
    kv = fn in (csv_kv2sparse, csv_kv2dense)
    with pytest.raises(ValueError, match=rf"row 1: (id|key) '{big}' is not a valid number \(an integer in the int64"):
        fn(["1:1" if kv else "1", f"{big}:1" if kv else big], 5)


@pytest.mark.parametrize("token", ["1_000", "1_0", "\u0661\u0662", "\uff11\uff12"])
def test_numbers_are_ascii_digits_as_in_csv_files_not_pythons_int_syntax(token):
    """'1_000', Arabic-Indic and full-width digits were taken as numbers (Python's int and
    float take them; TensorFlow's CSV parsers and a CSV file's readers do not)."""
    with pytest.raises(ValueError, match=rf"row 0: id '{token}' is not a valid number"):
        csv_id2sparse([token], 2000)
    with pytest.raises(ValueError, match=rf"row 0: value '{token}' is not a valid number"):
        csv_to_dense([token], 3)
    with pytest.raises(ValueError, match=rf"row 0: value '{token}' is not a valid number"):
        csv_kv2dense([f"1:{token}"], 3)


def test_max_id_past_int64_is_a_value_error():
    """max_id=2**63 was a bare OverflowError (the docs: a positive int, a ValueError)."""
    for fn in (csv_id2sparse, csv_id2dense, csv_to_dense):
        with pytest.raises(ValueError, match="max_id must be a positive int below 2\\*\\*63"):
            fn(["1"], 2**63)
