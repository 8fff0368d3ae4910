"""experiments/bench_bag_layout.py: both layouts pool identically; the smoke run's figures."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import bench_bag_layout
from experiments.configs import bench_bag_layout as bench_config
from sfjax.models.behavior import pooling
from tests.train import bag_data


def test_ragged_pooling_equals_the_padded_pooling():
  layout = bag_data.LAYOUT
  batch = bag_data.make_rows(9, seed=4)
  vids = np.where(batch.ids >= 0, np.arange(batch.ids.size).reshape(batch.ids.shape), 0)
  rows = jax.random.normal(jax.random.key(0), (batch.ids.size, 3))
  want = pooling.pool_features(layout, jnp.take(rows, vids, axis=0), jnp.asarray(batch.weights))
  rv, rw, rs = bench_bag_layout.ragged_inputs(layout, vids.astype(np.int32), batch.weights, 4)
  assert rv.shape[0] >= (batch.ids >= 0).sum() and (rs[(batch.ids >= 0).sum():] == 9 * 6).all()
  got = bench_bag_layout.ragged_pool(layout, rows, jnp.asarray(rv), jnp.asarray(rw),
                                     jnp.asarray(rs), 9)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # the fast tier stays under 5 minutes; make test-all runs it
def test_smoke_reports_both_layouts():
  result = bench_bag_layout.run(bench_config.get_config("smoke"))
  assert result["same_loss"] and result["padded_ms"] > 0 and result["ragged_ms"] > 0
  assert result["padded_bytes_per_example"] == 8.0 * result["id_columns"]
  assert 12.0 * result["ids_per_example"] <= result["ragged_bytes_per_example"]
