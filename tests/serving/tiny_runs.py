"""Tiny trained runs for the bundle and predictor tests, and the trainer's own eval logits.

`train_run(root, ...)` trains a few steps of a small model on synthetic data (or on
Criteo-format text it writes, `criteo=True`) with a checkpoint; `trainer_logits(run)`
scores the eval split exactly as `sfjax.train.evaluation.evaluate` does (the backend's
`prepare_eval` + `eval_logits`), returning the real examples only. `layout_config(model)`
is the same on the synthetic multi-hot data (`ctr.py:multihot_smoke`: bags, a weighted
bag, a history sequence sharing the item table); `trainer_layout_logits(run)` adds the
per-id weights of its examples.
"""

from __future__ import annotations

import json
import os
from typing import Any, NamedTuple

import numpy as np

from experiments.configs import ctr
from sfjax.data import SyntheticCTR
from sfjax.data import dataset as dataset_lib
from sfjax.models import block_spec, generator
from sfjax.train import loop


class Run(NamedTuple):
  """A trained run: workdir, config, data set, trainer, final state, final metrics."""

  workdir: str
  config: Any
  data: Any
  trainer: Any
  state: Any
  metrics: dict


def tiny_config(model: str = "deepfm", backend: str = "device", num_devices: int = 1,
                sharding: str | None = None):
  """A seconds-long smoke config: 4 steps of 128, 2,000 eval examples, checkpoint at 4."""
  c = ctr.get_config("smoke")
  c.data.synthetic.num_train, c.data.synthetic.num_eval = 4_000, 2_000
  c.model.name, c.model.mlp_dims = model, (32, 16)
  if model == "composed":  # the generator's spec of DeepFM
    spec = generator.named_model_spec("deepfm", c.model.embed_dim, mlp_dims=(32, 16))
    c.model.blocks = json.dumps(spec)
    c.model.embed_dim = block_spec.spec_embedding_width(block_spec.as_spec(spec))  # D + 1
  c.train.num_devices, c.train.batch_size = num_devices, 128
  c.train.steps = c.train.eval_every = 4
  c.train.eval_batch_size = 512
  c.embedding.backend = backend
  if backend == "cache":
    c.embedding.cache_rows = 0.25  # the cache evicts
  if sharding:
    c.embedding.cache_sharding = sharding
  c.checkpoint.every_steps = 4
  return c


def layout_config(model: str = "deepfm"):
  """4 steps of `model` on `ctr.py:multihot_smoke` (a feature layout), checkpoint at 4."""
  c = ctr.get_config("multihot_smoke")
  c.model.name, c.model.mlp_dims = model, (32, 16)
  c.train.num_devices, c.train.batch_size = 1, 128
  c.train.steps = c.train.eval_every = 4
  c.train.eval_batch_size = 512
  c.checkpoint.every_steps = 4
  return c


def train_run(root, config=None, criteo: bool = False, **kwargs) -> Run:
  """Trains `config` (default `tiny_config(**kwargs)`) under `root/run`."""
  root = str(root)
  c = config or tiny_config(**kwargs)
  if criteo:
    gen = SyntheticCTR(c.data.synthetic, seed=0)
    gen.write_criteo(f"{root}/train.tsv", "train", 2_000)
    gen.write_criteo(f"{root}/eval.tsv", "eval", 300)
    c.data.format = "criteo"  # data.hash_rows as set: 0 = a vocabulary, > 0 hashing
    c.data.train_path, c.data.eval_path = f"{root}/train.tsv", f"{root}/eval.tsv"
  data = dataset_lib.make_dataset(c.data, c.seed)
  trainer = loop.build_trainer(c, data.spec)
  workdir = os.path.join(root, "run")
  metrics, state = loop.train_and_evaluate(c, workdir, dataset=data, trainer=trainer)
  return Run(workdir, c, data, trainer, state, metrics)


def trainer_logits(run: Run, split: str = "eval") -> tuple[np.ndarray, ...]:
  """(logits [n], local ids [n, F], dense [n, Nd], labels [n]) of the split's real examples,
  scored by the trainer's eval path."""
  backend, parts = run.trainer.backend, []
  for batch in run.data.eval_batches(split, run.config.train.eval_batch_size):
    logits = np.asarray(backend.eval_logits(run.state, backend.prepare_eval(batch)))
    real = batch.mask > 0
    parts.append((logits[real], batch.ids[real], batch.dense[real], batch.labels[real]))
  return tuple(np.concatenate(p) for p in zip(*parts, strict=True))


def trainer_layout_logits(run: Run, split: str = "eval") -> tuple[np.ndarray, ...]:
  """(logits [n], local ids [n, S], dense [n, Nd], labels [n], weights [n, S]) of a
  feature-layout run's real examples, scored by the trainer's eval path."""
  backend, parts = run.trainer.backend, []
  for batch in run.data.eval_batches(split, run.config.train.eval_batch_size):
    logits = np.asarray(backend.eval_logits(run.state, backend.prepare_eval(batch)))
    real = batch.mask > 0
    parts.append((logits[real], batch.ids[real], batch.dense[real], batch.labels[real],
                  batch.weights[real]))
  return tuple(np.concatenate(p) for p in zip(*parts, strict=True))


def layout_records(ids: np.ndarray, dense: np.ndarray, weights: np.ndarray, layout) -> list:
  """Examples of a feature-layout run as the predictor's "ids" records (dicts of an id or a
  list of ids per feature, `<name>_weights` for a weighted bag, d0.. for dense)."""
  records = []
  for i in range(ids.shape[0]):
    record: dict = {f"d{d}": float(dense[i, d]) for d in range(dense.shape[1])}
    for f, spec in enumerate(layout.features):
      cols = layout.columns(f)
      kept = ids[i, cols] >= 0
      values = [int(v) for v in ids[i, cols][kept]]
      record[spec.name] = values[0] if spec.kind == "one_hot" else values
      if spec.weighted:
        record[f"{spec.name}_weights"] = [float(w) for w in weights[i, cols][kept]]
    records.append(record)
  return records
