"""Config for `python -m experiments.search`: an AutoML search over the CTR space.

Run:
  python -m experiments.search --config=experiments/configs/search_ctr.py --workdir=/tmp/search
  python -m experiments.search --config=experiments/configs/search_ctr.py:smoke \\
      --workdir=/tmp/search_smoke --config.study.algorithm=tpe --config.study.num_trials=8

Variants (the text after ':'): '' (default: ASHA over 64 trials of the CTR space on
synthetic Criteo-like data, every family but AutoInt and xDeepFM (the slowest to
compile and train on CPU; add them with `--config.space.families=...`), MLP widths
up to 256; about five minutes on 2 CPU cores), 'smoke' (about a minute: 16
trials of lr / fm / deepfm / wide_deep with narrow MLPs, short budgets).

Rerunning the same command on the same workdir resumes the study; a different
`task`, `seed` or `space` (or algorithm settings) on an existing workdir is an error.
"""

import ml_collections

from experiments.configs import ctr as ctr_config


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the search config; `arg` selects a variant ('' or 'smoke')."""
  c = ml_collections.ConfigDict()
  c.seed = 0  # data seed, algorithm seed, and base of the trials' init seeds

  # ---- the task every trial trains on (sfjax.cohorts.task.CTRTask) ----------
  c.task = t = ml_collections.ConfigDict()
  t.data = ctr_config.get_config().data  # the `data` block of experiments/configs/ctr.py
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

  # ---- the search space (search_spaces/ctr.py) --------------------------------
  c.space = s = ml_collections.ConfigDict()
  s.families = "lr,fm,deepfm,wide_deep,dcnv2,dlrm"  # model.name choices
  s.mlp_widths = "32,64,128,256"  # model.mlp.width choices

  # ---- the study (sfjax.ctr_search.search_loop) -----------------------------------
  c.study = st = ml_collections.ConfigDict()
  # Any name of sfjax.automl.ALGORITHMS: random | grid | qmc | evolution | tpe | gp |
  # successive_halving | asha | hyperband | bohb | pbt | nsga2 | motpe. An algorithm reads
  # the study fields named like its own settings (eta, population_size, num_iterations, ...).
  st.algorithm = "asha"
  # What the search optimises: '<metric>:max|min', comma-separated; more than one needs a
  # multi-objective algorithm (nsga2 | motpe). Metrics: auc, logloss, train_loss, params,
  # flops (per example of the eval forward), latency_ms (measured eval forward of one batch).
  # '' = 'auc:max'. The first objective picks the best trial; best.json holds the Pareto
  # front per budget.
  st.objectives = ""
  st.num_trials = 64  # trials trained to a final status (done / failed); rejected ones don't count
  st.cohort_width = "auto"  # 'auto' (measured per architecture) or an integer, e.g. '4'
  st.ask_batch = 0  # trials asked per round; 0: the cohort width ('auto': 8)
  # Architecture-aware asking: a round's first trial is asked freely, the others inside its
  # shape bucket (same family, row width, optimizers; MLP widths/depth and cross layers free),
  # so they share one padded vmapped program (sfjax.cohorts.buckets). False: every trial
  # of a round is asked freely (cohorts group only what the draws happen to share).
  st.fill_cohorts = True
  # Trials of one shape bucket with different step ranges (ASHA's promotions, each resuming
  # at its rung, and its new trials) share one program; a shorter trial idles (its steps past
  # its range are not applied) while the longest trains. False: one program per exact range.
  st.ragged_cohorts = True
  st.max_params = 0  # quota: reject configs with more parameters (0: no quota)
  st.max_flops = 0.0  # quota: reject configs whose eval forward costs more FLOPs/example (0: none)
  st.max_latency_ms = 0.0  # quota: reject configs whose measured eval forward is slower (0: none)
  st.min_budget = 1.0  # budget units; multi-fidelity algorithms start here
  st.max_budget = 9.0  # budget of a full trial (and of the default config's baseline run)
  st.eta = 3  # successive-halving reduction factor (asha, hyperband)
  st.num_iterations = 1  # hyperband: rounds of its brackets
  st.population_size = 16  # evolution: aging population; pbt: members; nsga2: generation size
  st.sample_size = 4  # evolution: tournament size
  st.n_startup_trials = 8  # tpe / gp / motpe / bohb: random trials before the model is used
  st.num_points_per_float = 1  # grid: points per float parameter
  st.shuffle = True  # grid: visit the grid in a seeded random order
  st.pbt_interval = 1.0  # pbt: budget units between exploit / explore steps
  st.pbt_model = ""  # pbt: model.name of the trained architecture ('' = the default config's)
  st.leaderboard_size = 10  # rows of the live leaderboard printed to stderr
  # Where cohorts run: 'local' (this process) or 'dask' (Dask distributed tasks; the driver
  # keeps the journal). dask_address: an existing scheduler ('' = start a LocalCluster of
  # dask_workers processes, one thread each).
  st.executor = "local"
  st.dask_address = ""
  st.dask_workers = 2

  if arg == "smoke":
    t.data.synthetic.num_train, t.data.synthetic.num_eval = 50_000, 10_000
    t.eval_rows, t.eval_batch_size = 4096, 2048
    t.steps_per_budget_unit = 20
    s.families = "lr,fm,deepfm,wide_deep"
    s.mlp_widths = "32,64"
    st.num_trials = 16
    st.min_budget, st.max_budget, st.eta = 1.0, 4.0, 2
    st.population_size, st.n_startup_trials = 6, 4
  elif arg:
    raise ValueError(f"unknown config variant {arg!r} (known: '', 'smoke')")
  return c
