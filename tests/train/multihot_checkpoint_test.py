"""Checkpoints, resume (8 <-> 1 devices, device <-> cache) and export of a feature layout.

A bag data set (bags, weighted bags, a sequence sharing the item table) trains 40
steps with checkpoints at 30 and 40; a copy without step 40 resumes under another
device count and backend and must end as the uninterrupted run. The export records
the tables' row ranges and the features that read them.
"""

import json
import os
import shutil

import chex
import jax
import numpy as np
import pytest

from sfjax.checkpoint import checkpointer as checkpoint
from sfjax.checkpoint import export
from sfjax.core import feature_layout as fl
from sfjax.train import loop
from tests.train import bag_data
from tests.train.multihot_backends_test import _config


def _ckpt_config(backend, devices, **embedding):
  c = _config(backend, devices, **embedding)
  c.train.eval_every, c.train.log_every = 20, 100
  c.checkpoint.every_steps, c.checkpoint.keep = 10, 2
  return c


def _run(c, workdir, data):
  trainer = loop.build_trainer(c, data.spec)
  losses = []
  metrics, state = loop.train_and_evaluate(c, workdir, dataset=data, trainer=trainer,
                                           loss_log=losses)
  table = (trainer.backend.host_table.read_all() if trainer.backend.host_table is not None
           else trainer.backend.table_rows(state))  # row order, whatever the layout
  return metrics, jax.device_get(state.params), table, np.asarray(losses)


def _table_manifests(step_dir):
  """The host-table checkpoint manifests under a checkpoint step (one per table shard)."""
  out = []
  for root, _, files in os.walk(step_dir):
    if "manifest.json" in files:
      manifest = json.loads(open(os.path.join(root, "manifest.json")).read())
      if manifest.get("format") == "sfjax.table_checkpoint":
        out.append(manifest)
  return out


@pytest.mark.slow
@pytest.mark.parametrize("first,second,layout", [
    (("device", 8), ("device", 1), bag_data.LAYOUT),
    # a row-sharded cache on 8
    (("cache", 1), ("cache", 8, {"cache_sharding": "row"}), bag_data.LAYOUT),
    # tables of their own optimizers, rates, initializers and dims
    (("device", 1), ("device", 8), bag_data.DIMS_LAYOUT),
    (("device", 8, {"sharding": "row"}), ("device", 1), bag_data.DIMS_LAYOUT),
    (("cache", 8, {"cache_sharding": "row"}), ("cache", 1), bag_data.DIMS_LAYOUT),
], ids=["device8-device1", "cache1-rowcache8", "dims-device1-device8", "dims-rowdevice8-device1",
        "dims-rowcache8-cache1"])
def test_resume_elsewhere_and_export_carry_the_layout(tmp_path, first, second, layout):
  data = bag_data.BagDataset(layout=layout)
  def config(backend, devices, embedding=None):
    return _ckpt_config(backend, devices, **(embedding or {}))

  ref, ref_params, ref_table, ref_losses = _run(config(*first), str(tmp_path / "ref"), data)
  run_dir = str(tmp_path / "run")
  shutil.copytree(str(tmp_path / "ref"), run_dir)
  shutil.rmtree(os.path.join(run_dir, "checkpoints", "step_00000040"))
  if first[0] == "cache" and layout is bag_data.DIMS_LAYOUT:  # rows at each table's width
    entries = [e for m in _table_manifests(os.path.join(run_dir, "checkpoints", "step_00000030"))
               for e in list(m["chunks"].values()) + [d["rows"] for d in m["deltas"]]]
    assert entries and all(e.get("packed") for e in entries)
  got, params, table, losses = _run(config(*second), run_dir, data)
  tol = {"rtol": 1e-5, "atol": 1e-6}
  assert len(losses) == 10
  np.testing.assert_allclose(losses, ref_losses[30:], **tol)
  chex.assert_trees_all_close(params, ref_params, **tol)
  chex.assert_trees_all_close(tuple(table), tuple(ref_table), **tol)
  # AUC moves in steps of one (positive, negative) pair: logits equal up to float rounding
  # (another device count sums in another order) may reorder a near tie, so allow two pairs.
  positives = float(data._eval.labels.sum())
  pair = 1.0 / (positives * (data._eval.labels.size - positives))
  assert abs(got["auc"] - ref["auc"]) <= 2 * pair, (got["auc"], ref["auc"], pair)

  manifest = export.export_checkpoint(run_dir, str(tmp_path / "export"))
  assert fl.layout_from_json(manifest["features"]) == layout
  assert manifest["field_names"] == ["user", "item", "tag"]  # the tables' row ranges
  assert manifest["field_rows"] == [300, 500, 40] and manifest["num_rows"] == 840
  _, values, _ = export.read_export(str(tmp_path / "export"))
  np.testing.assert_allclose(values, np.asarray(table[0]), **tol)


@pytest.mark.slow  # the fast tier stays under 5 minutes; make test-all runs it
def test_a_changed_layout_is_refused_on_resume(tmp_path):
  data = bag_data.BagDataset()
  c = _ckpt_config("device", 1)
  c.train.steps = 10
  _run(c, str(tmp_path / "w"), data)
  features = list(bag_data.LAYOUT.features)
  features[2] = fl.FeatureSpec("tags", "tag", "multi_hot", 5, "sum", weighted=True)
  other = fl.FeatureLayout(bag_data.LAYOUT.tables, tuple(features))
  c.train.steps = 20
  with pytest.raises(Exception, match="features") as info:
    _run(c, str(tmp_path / "w"), bag_data.BagDataset(layout=other))
  assert "pool" in str(info.value) or "features" in str(info.value)
  meta = json.loads(open(os.path.join(str(tmp_path / "w"), "config.json")).read())
  assert meta  # the saved run is untouched
  assert checkpoint.committed_steps(os.path.join(str(tmp_path / "w"), "checkpoints")) == [10]
