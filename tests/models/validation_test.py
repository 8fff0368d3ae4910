"""Tests for sfjax.models.validation."""

import numpy as np
import pytest

from sfjax.models import validation


def test_as_layer_dims_accepts_lists_and_returns_int_tuple():
  assert validation.as_layer_dims("m", "model.mlp_dims", [4, 2]) == (4, 2)
  assert validation.as_layer_dims("m", "model.mlp_dims", ()) == ()
  sampled = validation.as_layer_dims("m", "model.mlp_dims", np.array([8, 4]).tolist())
  assert sampled == (8, 4)
  widths = validation.as_layer_dims("m", "model.mlp_dims", (np.int64(8), np.int32(4)))
  assert widths == (8, 4) and all(type(w) is int for w in widths)


@pytest.mark.parametrize("bad", [(4, 0), (True,), "400", 400, (2.5,)])
def test_as_layer_dims_rejects_bad_widths_naming_the_key(bad):
  with pytest.raises(ValueError, match=r"m: model\.mlp_dims must be a sequence"):
    validation.as_layer_dims("m", "model.mlp_dims", bad)


def test_as_layer_dims_can_require_a_layer():
  with pytest.raises(ValueError, match=r"model\.cin_dims must name at least one layer"):
    validation.as_layer_dims("xdeepfm", "model.cin_dims", (), allow_empty=False)


def test_as_count_and_check_sizes():
  assert validation.as_count("m", "model.cross_layers", 0, low=0) == 0
  with pytest.raises(ValueError, match=r"model\.attention_heads must be an int >= 1"):
    validation.as_count("m", "model.attention_heads", 0, low=1)
  sizes = validation.check_sizes("m", num_fields=np.int64(3), embed_dim=1, num_dense=0)
  assert sizes == (3, 1, 0) and type(sizes[0]) is int
  with pytest.raises(ValueError, match=r"m: model\.embed_dim must be an int >= 1, got 0"):
    validation.check_sizes("m", num_fields=2, embed_dim=0, num_dense=0)
  with pytest.raises(ValueError, match=r"m: num_dense must be an int >= 0"):
    validation.check_sizes("m", num_fields=2, embed_dim=2, num_dense=-1)


def test_check_inputs_names_model_and_expected_layout():
  emb, dense = np.zeros((4, 3, 5)), np.zeros((4, 2))
  validation.check_inputs("fm", emb, dense, num_fields=3, width=5, num_dense=2)
  with pytest.raises(ValueError, match=r"fm: emb must be \[B, 3, 6\].*\(4, 3, 5\)"):
    validation.check_inputs("fm", emb, dense, num_fields=3, width=6, num_dense=2)
  with pytest.raises(ValueError, match=r"fm: emb must be"):
    validation.check_inputs("fm", np.zeros((4, 15)), dense, num_fields=3, width=5, num_dense=2)
  with pytest.raises(ValueError, match=r"fm: dense must be \[4, 0\].*\(4, 2\)"):
    validation.check_inputs("fm", emb, dense, num_fields=3, width=5, num_dense=0)
  with pytest.raises(ValueError, match=r"fm: dense must be \[4, 2\]"):
    validation.check_inputs("fm", emb, np.zeros((3, 2)), num_fields=3, width=5, num_dense=2)


def test_split_first_order_takes_last_column_as_weight():
  emb = np.arange(2 * 3 * 4).reshape(2, 3, 4)
  vectors, weights = validation.split_first_order(emb)
  np.testing.assert_array_equal(vectors, emb[..., :3])
  np.testing.assert_array_equal(weights, emb[..., 3])
