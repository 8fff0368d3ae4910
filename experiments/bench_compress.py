"""Seconds of a Prune-EA / Quant-EA search (the pipeline's `compress` step) per dots choice.

  python -m experiments.bench_compress [--config=experiments/configs/bench_compress.py[:smoke]]
      [--config.choices=xla,eigen --config.rounds=3 --config.out=bench.json]

A DeepFM with random weights (the search's cost does not depend on them) over synthetic
Criteo-like data is searched with `sfjax.compress.search` (every candidate
fine-tuned in one vmapped program, then scored on the valid and test rows) once per
choice of `train.xla_cpu_dots` in each round, the choices in turn; each search compiles
its program afresh, as the step does, so the seconds include compiling. Per choice: the
rounds' seconds and their median; `speedup` is the first choice's median over each
other's; `max_auc_diff` the largest difference between the choices' candidates' valid
AUCs (the choice changes float rounding only). Ends stdout with one JSON line.
"""

from __future__ import annotations

import statistics
import time

import jax
import ml_collections
import numpy as np
from flax import nnx

from experiments import cli
from sfjax.compress import load_data, make_spec, search
from sfjax.core import ConfigError, resolve_xla_cpu_dots, xla_cpu_compiler_options
from sfjax.data import make_dataset
from sfjax.models import build_model_from_config
from sfjax.train import ctr_defaults


def _choices(config: ml_collections.ConfigDict) -> list[str]:
  """The listed `train.xla_cpu_dots` choices, each checked."""
  choices = [c.strip() for c in str(config.choices).split(",") if c.strip()]
  try:
    for choice in choices:
      resolve_xla_cpu_dots(choice)
  except ConfigError:
    choices = []
  if not choices:
    raise ConfigError("config field choices: must list some of 'auto', 'eigen', 'xla', got "
                      f"{config.choices!r}")
  return choices


def _problem(config: ml_collections.ConfigDict):
  """(graphdef, spec, params, values, data): a random DeepFM and its search data."""
  data_cfg = ctr_defaults().data
  s = data_cfg.synthetic
  s.num_train, s.num_eval, s.test_rows = config.num_train, config.num_eval, config.num_eval
  dataset = make_dataset(data_cfg, config.seed)
  model = {"name": "deepfm", "embed_dim": config.embed_dim, "mlp_dims": tuple(config.mlp_dims)}
  spec = make_spec(model, dataset.spec.num_fields, dataset.spec.num_dense, None, (8, 32))
  graphdef, state = nnx.split(nnx.eval_shape(lambda: build_model_from_config(
      model, num_fields=spec.num_fields, num_dense=spec.num_dense, rngs=nnx.Rngs(0))))
  rng = np.random.default_rng(config.seed)
  params = jax.tree.map(lambda a: rng.normal(0, 0.05, a.shape).astype(np.float32),
                        nnx.to_pure_dict(state))
  values = rng.normal(0, 0.1, (dataset.spec.total_rows, spec.width)).astype(np.float32)
  data = load_data(dataset, config.finetune_steps, config.batch_size, config.seed,
                   valid_rows=config.valid_rows)
  return graphdef, spec, params, values, data


def run(config: ml_collections.ConfigDict) -> dict:
  """Times the search under each choice, `rounds` times in turn; returns the figures."""
  choices = _choices(config)
  graphdef, spec, params, values, data = _problem(config)
  seconds: dict[str, list[float]] = {c: [] for c in choices}
  valid: dict[str, np.ndarray] = {}
  for _ in range(int(config.rounds)):
    for choice in choices:
      options = xla_cpu_compiler_options(choice, jax.default_backend())
      start = time.perf_counter()
      candidates = search(
          graphdef, spec, params, values, data, population=config.population,
          generations=config.generations, learning_rate=1e-3, mutation_rate=0.1,
          seed=config.seed, compiler_options=options)
      seconds[choice].append(time.perf_counter() - start)
      valid[choice] = np.asarray([c.valid for c in candidates])
  medians = {c: statistics.median(s) for c, s in seconds.items()}
  first = choices[0]
  return {
      "benchmark": "bench_compress", "backend": jax.default_backend(),
      "resolved": {c: resolve_xla_cpu_dots(c) for c in choices},
      "candidates": int(valid[first].size), "seconds": seconds, "median_seconds": medians,
      "speedup": {c: medians[first] / medians[c] for c in choices[1:]},
      "max_auc_diff": max(float(np.max(np.abs(valid[c] - valid[first]))) for c in choices),
  }


if __name__ == "__main__":
  cli.run_benchmark("bench_compress", run)
