"""experiments/bench_table_widths.py: the smoke run's figures and its config errors."""

import pytest

from experiments import bench_table_widths
from experiments.configs import bench_table_widths as bench_config
from sfjax.core import ConfigError


def test_smoke_stores_each_tables_kept_columns_and_reads_the_same_rows():
  result = bench_table_widths.run(bench_config.get_config("smoke"))
  assert result["same_rows"] and result["packed"]["packed"] and not result["full"]["packed"]
  # Rows of 17 columns (16 latent + first order), row-wise Adagrad's 1 slot, a 1-byte flag;
  # dims 4, 8, 16, 0 keep 5, 9, 17, 17 columns: 12 on average.
  assert result["full"]["bytes_per_row"] == 17 * 4 + 4 + 1
  assert result["packed"]["bytes_per_row"] == 12 * 4 + 4 + 1
  assert result["bytes_ratio"] == pytest.approx(53 / 73)
  assert result["packed"]["gather_ms"] > 0 and result["full"]["scatter_ms"] > 0
  # Checkpoints (one chunk of 40k rows, a 128-byte .npy header): each row's stored columns,
  # its slot and its index in the chunk, as float32.
  header = 128 / 40_000
  assert result["full"]["checkpoint_bytes_per_row"] == pytest.approx((17 + 1 + 1) * 4 + header)
  assert result["packed"]["checkpoint_bytes_per_row"] == pytest.approx((12 + 1 + 1) * 4 + header)
  assert result["full"]["restored_same"] and result["packed"]["restored_same"]
  assert result["checkpoint_bytes_ratio"] < 0.75 and result["packed"]["save_s"] > 0
  # The device backend's checkpoint of the same rows at the model's width (orbax, which
  # compresses): the unread zero columns take little, below even the 56 B/row packed.
  device = result["device_checkpoint"]
  assert device["restored_same"] and device["save_s"] > 0 and device["restore_s"] > 0
  assert 12 * 4 * 0.75 < device["bytes_per_row"] < (12 + 1 + 1) * 4


def test_adagrad_slots_pack_with_their_rows():
  config = bench_config.get_config("smoke")
  config.optimizer, config.dims, config.steps = "adagrad", "4", 1
  result = bench_table_widths.run(config)
  assert result["same_rows"]
  assert result["full"]["bytes_per_row"] == 17 * 8 + 1 and result["packed"]["bytes_per_row"] == 5 * 8 + 1
  # A dim-4 table with adagrad slots on disk: 5 + 5 columns and the index against 17 + 17.
  assert result["checkpoint_bytes_ratio"] == pytest.approx(44 / 140, rel=1e-3)


@pytest.mark.parametrize("field, value, match", [
    ("optimizer", "sgd", "config field optimizer: 'sgd' is not one of rowwise_adagrad, adagrad, adam"),
    ("dims", "4,x", "config field dims: expected comma-separated integers, got '4,x'"),
    ("dims", "4,17", r"config field dims: each must be in \[0, embed_dim=16\], got '4,17'"),
    ("num_rows", 3, "config field num_rows: 3 is below the 4 tables or ids_per_step=2000"),
])
def test_bad_config_fields_are_named(field, value, match):
  config = bench_config.get_config("smoke")
  config[field] = value
  with pytest.raises(ConfigError, match=match):
    bench_table_widths.run(config)
