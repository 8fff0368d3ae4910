"""The CTR search's defaults: `search_defaults()`, the whole config `run_search` reads.

The library owns every default: `experiments/configs/search_ctr.py` starts from
`search_defaults()` and sets only its variants' differences, and a pipeline's
search step holds only overrides of its blocks.

  seed    data seed, algorithm seed, and base of the trials' init seeds
  task    the `CTRTask` every trial trains on (`sfjax.cohorts.task`)
  space   the options of the application's space (`CTRSearchSpace.from_config`)
  study   the settings every algorithm shares (`study.*`: trials, cohorts, budgets,
          quotas, objectives, executor) and one block per registered algorithm
          (`study.<name>.*`, e.g. `study.asha.eta`), generated from its spec
          (`sfjax.automl.algorithms.default_block`): a new algorithm needs no edit here.

Run command of the config built on it: see `experiments/configs/search_ctr.py`.
"""

from __future__ import annotations

from typing import Any

import ml_collections
from ml_collections import config_dict

from sfjax.automl.algorithms import ALGORITHMS, default_block, setting_types
from sfjax.train.defaults import ctr_defaults

# Spec fields a search fills from its own settings, so no algorithm block holds them:
# the seed (`config.seed`) and the budgets (`study.min_budget` / `study.max_budget`, which
# the default config's baseline and the trial tables read too).
SHARED_SPEC_FIELDS = ("seed", "min_budget", "max_budget")
# Where the CTR search departs from an algorithm's own defaults: fewer random trials before
# a model is fitted, a smaller aging population, a one-point-per-float shuffled grid (the
# values of the flat `study` block these settings lived in, so seeded searches ask alike).
SEARCH_ALGORITHM_DEFAULTS: dict[str, dict[str, Any]] = {
    "grid": {"num_points_per_float": 1, "shuffle": True},
    "evolution": {"population_size": 16, "sample_size": 4},
    "tpe": {"n_startup_trials": 8},
    "gp": {"n_startup_trials": 8},
    "bohb": {"n_startup_trials": 8},
    "motpe": {"n_startup_trials": 8},
}


def _algorithm_block(name: str) -> ml_collections.ConfigDict:
  """The search's default block of algorithm `name`: its spec's fields and defaults (minus
  `SHARED_SPEC_FIELDS`), with `SEARCH_ALGORITHM_DEFAULTS` on top. A None default becomes a
  typed placeholder, so `--config.study.<name>.<field>=...` parses."""
  spec = ALGORITHMS[name]
  values = {**default_block(spec, SHARED_SPEC_FIELDS), **SEARCH_ALGORITHM_DEFAULTS.get(name, {})}
  types = setting_types(spec)
  block = ml_collections.ConfigDict()
  for field, value in values.items():
    block[field] = config_dict.placeholder(types[field]) if value is None else value
  return block


def study_defaults() -> ml_collections.ConfigDict:
  """The `study` block: shared settings, then one block per registered algorithm."""
  st = ml_collections.ConfigDict()
  # Any name of sfjax.automl.ALGORITHMS: random | grid | qmc | evolution | tpe | gp |
  # successive_halving | asha | hyperband | bohb | pbt | nsga2 | motpe. Its settings are
  # in its own block below (`study.asha.eta`, `study.pbt.population_size`, ...).
  st.algorithm = "asha"
  # What the search optimises: '<metric>:max|min', comma-separated; more than one needs a
  # multi-objective algorithm (nsga2 | motpe). Metrics: auc, logloss, train_loss, params,
  # flops (per example of the eval forward), latency_ms (the serving forward's latency at
  # study.latency_batch_size examples: see study.latency_source below).
  # '' = 'auc:max'. The first objective picks the best trial; best.json holds the Pareto
  # front per budget.
  st.objectives = ""
  st.num_trials = 64  # trials trained to a final status (done / failed); rejected ones don't count
  st.cohort_width = "auto"  # 'auto' (measured per architecture) or an integer, e.g. '4'
  st.ask_batch = 0  # trials asked per round; 0: the cohort width ('auto': 8)
  # Merge a round's proposals into as few programs as possible (issue #26). Every trial is
  # the algorithm's own free proposal either way (never resampled inside a bucket); on, the
  # proposals' shape buckets (MLP widths/depth, cross layers, maskable embed_dim, gated block
  # sets: sfjax.cohorts.shape_buckets.buckets) also ignore the row optimizer: each lane of a padded
  # vmapped program picks its own (sfjax.cohorts.lane_optimizers). False: one program per
  # shape bucket with its row optimizer (the grouping before the merge).
  st.fill_cohorts = True
  # Trials of one shape bucket with different step ranges (ASHA's promotions, each resuming
  # at its rung, and its new trials) share one program; a shorter trial idles (its steps past
  # its range are not applied) while the longest trains. False: one program per exact range.
  st.ragged_cohorts = True
  st.max_params = 0  # quota: reject configs with more parameters (0: no quota)
  st.max_flops = 0.0  # quota: reject configs whose eval forward costs more FLOPs/example (0: none)
  st.max_latency_ms = 0.0  # quota: reject configs whose serving forward is slower (0: none)
  # latency_ms (objective, quota): the forward a serving bundle exports (jax.export),
  # compiled on the driver's device at latency_batch_size examples (sfjax.cohorts.latency).
  # 'measured': median wall time of latency_repeats calls (cached per architecture; wall
  # times vary, so such a search is not bit-reproducible); 'model': a deterministic
  # roofline estimate from XLA's cost analysis of that program (nominal device).
  st.latency_source = "measured"
  st.latency_batch_size = 512
  st.latency_repeats = 20
  st.min_budget = 1.0  # budget units; multi-fidelity algorithms start here
  st.max_budget = 9.0  # budget of a full trial (and of the default config's baseline run)
  st.pbt_model = ""  # pbt: model.name of the trained architecture ('' = the default config's)
  st.leaderboard_size = 10  # rows of the live leaderboard printed to stderr
  # Mirror the study to an Optuna storage, live, for `optuna-dashboard <storage>`
  # (sfjax.ctr_search.search_events): '' (off), a journal file path ending .log / .jsonl,
  # or an SQLite URL 'sqlite:///path.db'. optuna_study_name: '' = the workdir's base name.
  st.optuna_storage = ""
  st.optuna_study_name = ""
  # Where cohorts run: 'local' (this process) or 'dask' (Dask distributed tasks; the driver
  # keeps the journal). dask_address: an existing scheduler ('' = start a LocalCluster of
  # dask_workers processes, one thread each).
  st.executor = "local"
  st.dask_address = ""
  st.dask_workers = 2
  # How cohorts reach the workers (sfjax.ctr_search.dispatch): 'rounds' (ask a round, run its
  # cohorts, wait for all of them), 'async' (a queue of ready cohorts across buckets and
  # rounds: a free worker takes the next, the algorithm asks as soon as a result arrives;
  # random, qmc, grid, evolution, tpe, motpe, asha, hyperband, bohb), 'auto' (async on 'dask'
  # with such an algorithm, else rounds). dispatch.json in the workdir: worker busy fraction.
  st.dispatch = "auto"
  # Pruning inside cohorts (sfjax.cohorts.pruning, Optuna's median / percentile rule): at each
  # eval point (every eval_every budget units of a trial's own steps) a member whose best
  # objective so far is worse than the percentile of the completed trials' values at that
  # step (after n_startup_trials completed, from step n_warmup_steps) is pruned, and its lane
  # refilled with the algorithm's next trial of the bucket. kind: none | median | percentile
  # (percentile: p-th, median = 50). 'none' runs the search exactly as without it.
  st.pruner = ml_collections.ConfigDict({"kind": "none", "percentile": 25.0,
                                         "n_startup_trials": 5, "n_warmup_steps": 0,
                                         "eval_every": 1.0})
  # ---- one block per algorithm (generated from its spec) ----
  for name in ALGORITHMS:
    st[name] = _algorithm_block(name)
  return st


def search_defaults() -> ml_collections.ConfigDict:
  """A fresh ConfigDict with every field of a CTR search at its default.

  The default search: ASHA over 64 trials of the CTR space on synthetic Criteo-like
  data: models generated from blocks (the named models are its presets), tower widths up
  to 256.
  """
  c = ml_collections.ConfigDict()
  c.seed = 0  # data seed, algorithm seed, and base of the trials' init seeds

  # ---- the task every trial trains on (sfjax.cohorts.task.CTRTask) ----------
  c.task = t = ml_collections.ConfigDict()
  t.data = ctr_defaults().data  # the trainer's `data` block (sfjax/train/defaults.py)
  t.data.synthetic.num_train = 200_000
  t.data.synthetic.num_eval = 20_000  # held out: never trained on
  t.data.synthetic.cardinality_scale = 0.0003  # ~10k table rows: small saved states
  t.batch_size = 256
  t.eval_rows = 8192  # held-out examples every trial (and the default config) is scored on
  t.eval_batch_size = 2048
  t.steps_per_budget_unit = 50  # a budget b trains round(b * 50) steps
  # Trial tables hold only the rows the task's batches touch (the steps of study.max_budget
  # are fixed up front), so a cohort's memory does not grow with the table's cardinality.
  t.compact_rows = True
  # Where trial tables live (issue #26): 'device' (each trial its own table in its program)
  # or 'cache' (a cohort's trials share one host table of W x E-wide rows behind one device
  # cache of cache_rows rows, 0 = auto; sfjax.cohorts.host_cohort). 'cache' needs
  # compact_rows=False and a single-fidelity algorithm without pruning (trials do not resume).
  t.embedding_backend = "device"
  t.cache_rows = 0
  t.cache_lookahead = 2
  # The library XLA:CPU computes the cohort programs' dots with (the trainer's
  # train.xla_cpu_dots, sfjax/core/xla_cpu_dots.py): 'auto' (Eigen on AMD CPUs), 'eigen' or
  # 'xla'. Float rounding only: a study may resume under another choice (other hardware).
  t.xla_cpu_dots = "auto"

  # ---- the search space's options (read by the application's CTRSearchSpace) ----
  c.space = s = ml_collections.ConfigDict()
  # '' (default): models generated from blocks, the named models its presets (issue #26;
  # the application's default space, search_spaces/default.py). Model names, e.g.
  # "lr,fm,deepfm,wide_deep,dcnv2,dlrm": the named families' space (model.name choices).
  s.families = ""
  s.mlp_widths = "32,64,128,256"  # the tower's widths (model.tower.width / model.mlp.width)
  # Bags whose pooling is searched, each with the baseline's (the data set's) pooling:
  # "bag1:mean,long0:sqrtn" -> features.<bag>.pooling in {sum, mean, sqrtn} (issue #22).
  s.poolings = ""
  # Tables whose embedding dim is searched (named families only), e.g. "item:4|8,user:2|4"
  # -> tables.<table>.dim in {0 (the model's), 4, 8} (issue #22; rows stay embed_dim wide).
  s.table_dims = ""

  # ---- the study (sfjax.ctr_search.search_loop) -----------------------------
  c.study = study_defaults()
  return c
