"""Embedding-layout remap rules: indices, slot blocks and size inference from shapes."""

import numpy as np
import pytest

from sfjax.cohorts.shape_buckets import bucket_layout as pl

LAYOUT = pl.EmbedLayout(first_order=True, num_fields=3, num_dense=2, dim=2, sup_dim=4)


def test_maskable_models_and_row_optimizers():
  assert pl.embed_maskable("deepfm", "adam") and pl.embed_maskable("dlrm", "sgd")
  assert not pl.embed_maskable("deepfm", "rowwise_adagrad")
  assert not pl.embed_maskable("composed", "adagrad")


def test_table_columns_keep_latent_prefix_and_move_the_first_order_column():
  np.testing.assert_array_equal(LAYOUT.table_columns(), [0, 1, 4])
  np.testing.assert_array_equal(LAYOUT._replace(first_order=False).table_columns(), [0, 1])


def test_flat_segment_maps_field_columns_and_dense_features():
  # field f column j: f*2 + j -> f*4 + j; dense k: 6 + k -> 12 + k
  np.testing.assert_array_equal(LAYOUT.segment_index(pl.FLAT), [0, 1, 4, 5, 8, 9, 12, 13])
  assert LAYOUT.segment_size(pl.FLAT, sup=False) == 8 and LAYOUT.segment_size(pl.FLAT, sup=True) == 14
  np.testing.assert_array_equal(
      pl._axis_index(LAYOUT, (pl.FLAT, pl.REST), 8 + 3, 14 + 5, "head"),
      [0, 1, 4, 5, 8, 9, 12, 13, 14, 15, 16])
  np.testing.assert_array_equal(pl._axis_index(LAYOUT, (pl.VEC, pl.REST), 2 + 3, 4 + 3, "top"),
                                [0, 1, 4, 5, 6])
  with pytest.raises(ValueError, match="does not follow"):
    pl._axis_index(LAYOUT, (pl.FLAT,), 9, 14, "mlp kernel")


def test_rules_name_the_axes_that_follow_the_layout():
  mlp = {"['mlp']['hidden'][0]['kernel'].value": (8, 4), "['mlp']['out']['kernel'].value": (4, 1)}
  assert pl._axis_segments("['mlp']['hidden'][0]['kernel'].value", mlp) == {0: (pl.FLAT,)}
  assert pl._axis_segments(".inner_state[0].mu['mlp']['hidden'][0]['kernel'].value", mlp) == {
      0: (pl.FLAT,)}  # optimizer state follows its parameter
  assert pl._axis_segments("['mlp']['out']['kernel'].value", mlp) == {}
  no_hidden = {"['mlp']['out']['kernel'].value": (8, 1)}
  assert pl._axis_segments("['mlp']['out']['kernel'].value", no_hidden) == {0: (pl.FLAT,)}
  assert pl._axis_segments("['cross'][1]['kernel'].value", mlp) == {0: (pl.FLAT,), 1: (pl.FLAT,)}
  assert pl._axis_segments("['cross'][0]['up'].value", mlp) == {1: (pl.FLAT,)}
  assert pl._axis_segments("['head']['kernel'].value", mlp) == {0: (pl.FLAT, pl.REST)}
  assert pl._axis_segments("['head']['kernel'].value", {}) == {0: (pl.FLAT, pl.FLAT)}
  assert pl._axis_segments("['attention_head']['kernel'].value", mlp) == {}
  dlrm = {"['bottom']['hidden'][0]['kernel'].value": (2, 4), "['top']['hidden'][0]['kernel'].value": (7, 4)}
  assert pl._axis_segments("['top']['hidden'][0]['kernel'].value", dlrm) == {0: (pl.VEC, pl.REST)}
  assert pl._axis_segments("['top']['hidden'][0]['kernel'].value", {}) == {}  # no z: dots only


def test_slot_blocks_follow_the_columns_and_refuse_row_wise_slots():
  index, fill = pl.slot_layout(LAYOUT, 3, 6, 5, 10)  # adam / ftrl: two blocks
  np.testing.assert_array_equal(index, [0, 1, 4, 5, 6, 9])
  assert not fill.any()
  index, fill = pl.slot_layout(LAYOUT, 3, 3, 5, 5)  # adagrad: a positive accumulator
  np.testing.assert_array_equal(index, [0, 1, 4])
  assert (fill > 0).all()
  assert pl.slot_layout(LAYOUT, 3, 0, 5, 0)[0].size == 0  # sgd
  with pytest.raises(ValueError, match="not element-wise"):
    pl.slot_layout(LAYOUT, 3, 1, 5, 1)


def test_infer_layout_from_shapes():
  assert pl.infer_layout({}, {}, 5, 5) is None

  def deep(d, e):
    return {"['dense_linear']['kernel'].value": (2,),
            "['mlp']['hidden'][0]['kernel'].value": (3 * d + 2, 8)}

  assert pl.infer_layout(deep(2, 3), deep(4, 5), 3, 5) == LAYOUT  # deepfm: rows d + 1
  assert pl.infer_layout(deep(2, 2), deep(4, 4), 2, 4) == LAYOUT._replace(first_order=False)
  fm = {"['bias'].value": (), "['dense_linear']['kernel'].value": (2,)}
  assert pl.infer_layout(fm, fm, 3, 5) == pl.EmbedLayout(True, 0, 0, 2, 4)

  def dlrm(d):
    return {"['bottom']['hidden'][0]['kernel'].value": (2, 8),
            "['bottom']['hidden'][1]['kernel'].value": (8, d),
            "['top']['hidden'][0]['kernel'].value": (d + 6, 8)}

  assert pl.infer_layout(dlrm(2), dlrm(4), 2, 4) == pl.EmbedLayout(False, 0, 2, 2, 4)
  with pytest.raises(ValueError, match="no embed_dim layout rule"):
    pl.infer_layout({"['blocks'][0]['w'].value": (3,)}, {"['blocks'][0]['w'].value": (3,)}, 3, 5)
  with pytest.raises(ValueError, match="does not follow"):
    pl.infer_layout(deep(2, 3), {**deep(4, 5), "['mlp']['hidden'][0]['kernel'].value": (15, 8)}, 3, 5)
