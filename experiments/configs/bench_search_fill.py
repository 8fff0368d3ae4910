"""Config of `python -m experiments.bench_search_fill`: how full a real search's cohorts are.

Run:
  python -m experiments.bench_search_fill --config=experiments/configs/bench_search_fill.py
  python -m experiments.bench_search_fill --config=experiments/configs/bench_search_fill.py:smoke
  python -m experiments.bench_search_fill --config.space=blocks --config.modes=ragged,exact \\
      --config.search.study.num_trials=32 --config.out=bench_search_fill.json

Variants (the text after ':'): '' (the default search of experiments/configs/search_ctr.py,
every mode), 'smoke' (seconds: 8 ASHA trials of DeepFM on a tiny task, ragged and exact),
'widths' (no training: issue #26's width target, a 32-trial random search over the smoke
search's space and data, cohorts of up to 8, asked 8 and 32 at a time, seeds 0-2).
"""

import ml_collections

from experiments.configs import search_ctr


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the benchmark's config; `arg` selects a variant ('', 'smoke' or 'widths')."""
  c = ml_collections.ConfigDict()
  c.search = search_ctr.get_config()  # the search each mode runs (was the --config file)
  c.modes = "ragged,exact,free"  # comma-separated, of bench_search_fill.MODES
  c.space = "ctr"  # 'ctr' (search_spaces/ctr.py) or 'blocks' (search_spaces/blocks.py)
  c.out = ""  # also write the JSON result here
  c.group_only = False  # grouping only, no training (bench_search_fill.group_widths)
  c.group_asks = "8,32"  # group_only: the ask batches compared
  c.group_seeds = 3  # group_only: random-search seeds 0..group_seeds-1
  if arg == "widths":
    c.search = search_ctr.get_config("smoke")
    c.search.study.num_trials, c.search.study.cohort_width = 32, "8"
    c.group_only = True
  elif arg == "smoke":
    c.search = search_ctr.get_config("smoke")
    t, st = c.search.task, c.search.study
    t.data.synthetic.num_train, t.data.synthetic.num_eval = 8192, 2048
    t.data.synthetic.cardinality_scale = 0.0001
    t.batch_size, t.eval_rows, t.eval_batch_size, t.steps_per_budget_unit = 64, 1024, 1024, 4
    c.search.space.families, c.search.space.mlp_widths = "deepfm", "8,16"
    st.algorithm, st.num_trials, st.cohort_width = "asha", 8, "4"
    st.min_budget, st.max_budget, st.asha.eta = 1.0, 4.0, 2
    c.modes = "ragged,exact"
  elif arg:
    raise ValueError(f"unknown config variant {arg!r} (known: '', 'smoke', 'widths')")
  return c
