"""AutoFIS on planted synthetic data: does it find the planted pairs, and does keeping them pay?

  python -m experiments.bench_autofis [--seeds=0,1,2 --search_steps=1500 --out=bench.json]

For each data seed, the synthetic Criteo-like generator (26 fields; its hidden FM
makes a few field pairs dominate, `sfjax.data.planted`) gives a CTR task; AutoFIS
(`sfjax.structure.autofis.run_autofis`) searches the gates with gRDA and retrains on
the kept (nonzero-gate) pairs. Reported per seed:
  * precision / recall of the kept pairs against `planted_pairs` at each --shares
    value (the fewest pairs holding that share of the planted pairwise logit variance);
  * test AUC (second half of the eval rows, never used to select) of the retrain on the
    kept pairs, on as many random pairs (not kept), on all pairs and on none.
Ends stdout with one JSON line (also written to --out).
"""

from __future__ import annotations

import json
import sys
import time

import jax
import numpy as np
from absl import app, flags

from experiments import report
from experiments.configs import ctr as ctr_config
from sfjax.cohorts import task as trial_data
from sfjax.structure import autofis
from sfjax.structure import gate_training as structure_training

_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Data seeds (each its own planted model).")
_SEARCH = flags.DEFINE_integer("search_steps", 1500, "AutoFIS search steps (warm-up included).")
_WARMUP = flags.DEFINE_integer("warmup_steps", 300, "Search steps with the gates off.")
_RETRAIN = flags.DEFINE_integer("retrain_steps", 800, "Retrain steps.")
_BATCH = flags.DEFINE_integer("batch_size", 512, "Examples per step.")
_DIM = flags.DEFINE_integer("embed_dim", 8, "Embedding dimension.")
_MLP = flags.DEFINE_list("mlp_dims", [], "MLP widths (empty: the FM variant).")
_GRDA_C = flags.DEFINE_float("grda_c", 0.005, "gRDA threshold scale c.")
_GRDA_MU = flags.DEFINE_float("grda_mu", 0.8, "gRDA threshold growth mu.")
_GRDA_LR = flags.DEFINE_float("grda_lr", 1.0, "gRDA learning rate of the gates.")
_SCALE = flags.DEFINE_float("cardinality_scale", 1e-3, "Synthetic Criteo cardinality scale.")
_EVAL_ROWS = flags.DEFINE_integer("eval_rows", 20000, "Eval rows (first half valid, second half test).")
_SHARES = flags.DEFINE_list("shares", ["0.5", "0.8"], "Variance shares defining the planted truth.")
_BASELINES = flags.DEFINE_boolean("baselines", True, "Also retrain on random / all / no pairs.")
_OUT = flags.DEFINE_string("out", "", "Write the JSON result here too.")


def make_task(seed: int) -> trial_data.CTRTask:
  """The benchmark's task for one data seed (ctr.py's synthetic data block, rescaled)."""
  data = ctr_config.get_config().data
  data.synthetic.cardinality_scale = _SCALE.value
  data.synthetic.num_train = 1_000_000
  data.synthetic.num_eval = max(_EVAL_ROWS.value, 1)
  return trial_data.CTRTask(data, seed=seed, batch_size=_BATCH.value, eval_rows=_EVAL_ROWS.value,
                            eval_batch_size=min(_EVAL_ROWS.value, 4096))


def measure(seed: int, settings: autofis.AutoFISSettings, shares: list[float]) -> dict:
  """One seed's figures (see the module docstring)."""
  task = make_task(seed)
  t = time.perf_counter()
  data = structure_training.prepare_data(task, settings)
  data_s = time.perf_counter() - t
  result = autofis.run_autofis(task, settings, data=data)
  row = {"seed": seed, "kept": len(result.kept_pairs), "pairs": len(result.all_pairs),
         "kept_pairs": [list(p) for p in result.kept_pairs], "search_valid_auc": result.search_auc,
         "kept_test_auc": result.test_auc, "kept_valid_auc": result.valid_auc, "autofis_s": result.wall_s,
         "data_prep_s": data_s}
  for share in shares:
    truth = autofis.planted_pairs(task.data, seed, share=share)
    precision, recall = autofis.pair_precision_recall(result.kept_pairs, truth)
    row[f"truth_{share:g}"] = {"pairs": len(truth), "precision": precision, "recall": recall}
  if _BASELINES.value:
    rng = np.random.default_rng(seed)
    others = [p for p in result.all_pairs if p not in set(result.kept_pairs)]
    pool = others if len(others) >= len(result.kept_pairs) else list(result.all_pairs)  # most pairs kept
    random_pairs = [pool[i] for i in rng.choice(len(pool), len(result.kept_pairs), replace=False)]
    for name, pairs in (("random", random_pairs), ("all", result.all_pairs), ("none", ())):
      row[f"{name}_test_auc"] = autofis.retrain_with_pairs(data, settings, pairs)["test_auc"]
  return row


def main(argv):
  del argv
  seeds = [int(s) for s in _SEEDS.value]
  shares = [float(s) for s in _SHARES.value]
  settings = autofis.AutoFISSettings(
      embed_dim=_DIM.value, mlp_dims=tuple(int(w) for w in _MLP.value), search_steps=_SEARCH.value,
      warmup_steps=_WARMUP.value, retrain_steps=_RETRAIN.value, grda_c=_GRDA_C.value, grda_mu=_GRDA_MU.value,
      grda_lr=_GRDA_LR.value)
  rows = []
  for seed in seeds:
    rows.append(measure(seed, settings, shares))
    print(json.dumps(rows[-1], sort_keys=True), file=sys.stderr)
  summary = {}
  for share in shares:
    key = f"truth_{share:g}"
    summary[key] = {m: float(np.mean([r[key][m] for r in rows])) for m in ("precision", "recall")}
  if _BASELINES.value:
    summary["kept_minus_random_test_auc"] = float(np.mean([r["kept_test_auc"] - r["random_test_auc"] for r in rows]))
  result = {
      "benchmark": "bench_autofis", "settings": {k: (list(v) if isinstance(v, tuple) else v)
                                                  for k, v in vars(settings).items()},
      "cardinality_scale": _SCALE.value, "eval_rows": _EVAL_ROWS.value, "platform": jax.devices()[0].platform,
      "results": rows, "mean": summary,
  }
  report.emit_json_line(result, _OUT.value)


if __name__ == "__main__":
  app.run(main)
