"""Config for `python -m experiments.search`: an AutoML search over the CTR space.

Run:
  python -m experiments.search --config=experiments/configs/search_ctr.py --workdir=/tmp/search
  python -m experiments.search --config=experiments/configs/search_ctr.py:smoke \\
      --workdir=/tmp/search_smoke --config.study.algorithm=tpe --config.study.num_trials=8 \\
      --config.study.tpe.n_startup_trials=2

Every field and its default (with a comment) is in `sfjax/ctr_search/defaults.py`
(`sfjax.ctr_search.search_defaults()`); an algorithm's settings are in its own block
(`study.asha.eta`, `study.pbt.population_size`, ...).

The space: by default models generated from blocks (`search_spaces/default.py`; the
eight named models are its presets, `search_spaces.blocks.preset_config`);
`--config.space.families=lr,fm,deepfm` searches those named families instead, as before.

Variants (the text after ':'): '' (the library's default search: ASHA over 64 trials
of the CTR space on synthetic Criteo-like data, tower widths up to 256), 'smoke' (a few
minutes: 16 trials of generated models with narrow towers, short budgets), 'multihot_smoke'
(the smoke search on the planted multi-hot smoke data of `ctr.py:multihot_smoke`, issue #22:
bags, a long bag and a history; the poolings of `bag1` and `long0` searched, as
`space.poolings`; the trainer reproduces a trial's choice with `data.pooling`).

Rerunning the same command on the same workdir resumes the study; a different
`task`, `seed` or `space` (or algorithm settings) on an existing workdir is an error.
"""

import ml_collections

from experiments.configs import ctr as ctr_config
from sfjax.ctr_search import search_defaults


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the search config; `arg` selects a variant ('', 'smoke' or 'multihot_smoke')."""
  c = search_defaults()
  if arg in ("smoke", "multihot_smoke"):
    t, s, st = c.task, c.space, c.study
    t.data.synthetic.num_train, t.data.synthetic.num_eval = 50_000, 10_000
    # Data where a smoke budget learns (issue #26): no dense features (raw log1p counts through
    # the models' N(0, 1/Nd) dense weights start every trial at logits of std ~4, which ~100
    # steps cannot undo: the smoke trials sat at chance) and a stronger planted FM (half of
    # the logit variance, `data.synthetic.interaction_share`; 0.12 by default).
    t.data.synthetic.num_dense, t.data.synthetic.interaction_share = 0, 0.5
    t.eval_rows, t.eval_batch_size = 8192, 2048
    t.steps_per_budget_unit = 25
    s.mlp_widths = "32,64"  # the towers' widths
    st.num_trials = 16
    st.min_budget, st.max_budget = 1.0, 4.0
    # Smaller settings for whichever algorithm runs (`--config.study.algorithm=...`).
    st.asha.eta = st.hyperband.eta = st.successive_halving.eta = st.bohb.eta = 2
    st.evolution.population_size = st.pbt.population_size = st.nsga2.population_size = 6
    st.tpe.n_startup_trials = st.gp.n_startup_trials = 4
    st.motpe.n_startup_trials = st.bohb.n_startup_trials = 4
    if arg == "multihot_smoke":
      t.data = ctr_config.get_config("multihot_smoke").data
      t.batch_size, t.eval_rows, t.eval_batch_size = 256, 1024, 1024
      s.poolings = "bag1:mean,long0:sqrtn"  # each with the data set's own pooling first
  elif arg:
    raise ValueError(f"unknown config variant {arg!r} (known: '', 'smoke', 'multihot_smoke')")
  return c
