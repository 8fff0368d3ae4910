"""Config for `python -m experiments.pipeline`: VEGA's CTR pipeline on synthetic data.

Run:
  python -m experiments.pipeline --config=experiments/configs/pipeline_ctr.py --workdir=/tmp/pipe
  python -m experiments.pipeline --config=experiments/configs/pipeline_ctr.py:smoke \\
      --workdir=/tmp/pipe_smoke

Steps (`pipeline.order`): nas (ASHA over the CTR space: models generated from blocks,
the eight named models its presets) -> hpo (TPE
over the winner's hyperparameters) -> autofis (field-pair gates, gRDA) ->
fully_train (the winner, restricted to the kept pairs, through the CTR trainer,
checkpointed) -> baseline (the unsearched default DeepFM, same recipe). Data:
synthetic Criteo-like rows whose labels come from a planted FM (so some field
pairs matter); the searches and AutoFIS select on the first half of the `eval`
split; `fully_train` / `baseline` are scored on the separate `test` split
(`data.synthetic.test_rows`), which no step selects on, and the report carries the
paired bootstrap interval of their AUC difference.

Each step block holds only overrides of its kind's library defaults (the engine
merges them: `sfjax.ctr_pipeline.steps.nas_defaults` / `hpo_defaults`, the
search's `sfjax.ctr_search.search_defaults()`; `train_steps.recipe_defaults` for
`fully_train` / `baseline`); a misspelt key is an error naming the step and the
closest valid key. Override any of them, e.g. `--config.steps.nas.study.num_trials=8`
or `--config.steps.hpo.study.tpe.n_startup_trials=4`. Hardware-aware NAS hands on the
fastest model within ΔAUC of the best, latencies measured on the serving forward:
`--config.steps.nas.study.algorithm=nsga2
--config.steps.nas.study.objectives=auc:max,latency_ms:min
--config.steps.nas.select_within_auc=0.002`.

Variants: '' (full: several minutes on CPU, minutes on an accelerator), 'smoke'
(a few minutes of CPU on 2 cores, most of it NAS compiling generated models: small
budgets on data where they learn; run by
tests/experiments/pipeline_ctr_test.py, which asserts each step does its job: NAS and HPO
beat their default on the validation split, AutoFIS recalls the planted pairs, the final
model beats the baseline on the test split, issue #26). The smoke data plant stronger
pairwise interactions (`data.synthetic.interaction_share`) and no dense features (see
`get_config`).
"""

import ml_collections

from sfjax.ctr_search import search_defaults


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the pipeline config; `arg` selects a variant ('' or 'smoke')."""
  if arg not in ("", "smoke"):
    raise ValueError(f"unknown config variant {arg!r} (known: '', 'smoke')")
  smoke = arg == "smoke"
  c = ml_collections.ConfigDict()
  # Data seed, search seeds, trainer init seed. Seed 2's planted FM has two field pairs holding
  # half of its pairwise variance, (0, 10) and (6, 10): what autofis should find.
  c.seed = 2

  # ---- shared: the task every search trial and AutoFIS trains on ------------------------
  c.task = t = search_defaults().task
  s = t.data.synthetic
  # Rows are generated on the fly, so a large epoch costs nothing; fully_train's 3000 x 1024
  # examples stay within 1.5 epochs (on 500k rows, 8 epochs overfit the default DeepFM).
  s.num_train, s.num_eval = (200_000, 10_000) if smoke else (2_000_000, 50_000)
  s.test_rows = 20_000 if smoke else 200_000  # the final test split: read only by fully_train/baseline
  s.cardinality_scale = 0.0003 if smoke else 0.001  # ~10k / ~34k table rows
  # The searches select on (and compare with their default on) the first half of these rows.
  t.eval_rows = 8192 if smoke else 32_768
  t.steps_per_budget_unit = 50
  if smoke:  # data on which a smoke budget learns (issue #26)
    # Stronger planted interactions (the FM's share of the logit variance; 0.12 by default), so
    # the two planted pairs stand out within AutoFIS's few hundred steps.
    s.interaction_share = 0.5
    # No dense features: raw log1p counts through the models' N(0, 1/Nd) dense weights start
    # every trial at logits of std ~4 (initial loss ~4.6, AUC ~0.42); a trial of ~100 steps
    # with a dense learning rate <= 1e-2 cannot undo that, so the searches' trials sat at chance.
    s.num_dense = 0

  c.pipeline = ml_collections.ConfigDict()
  c.pipeline.order = "nas,hpo,autofis,fully_train,baseline"
  c.steps = st = ml_collections.ConfigDict()

  # ---- nas: architecture + hyperparameters over generated models (ASHA by default) -------
  # The default CTR space: models generated from blocks, the named models its presets
  # (search_spaces/default.py); `space.families` (e.g. "fm,deepfm") searches named families.
  st.nas = ml_collections.ConfigDict({"type": "nas", "search_space": "ctr"})
  if smoke:  # 8 trials of 100 steps (the default config too), in cohorts of up to 4
    st.nas.space = {"mlp_widths": "32"}  # towers of width 32
    # Every trial is the algorithm's own proposal; `study.fill_cohorts` (the default) only
    # groups them into shared padded programs (issue #26, 0a), never resamples.
    st.nas.study = {"algorithm": "random", "num_trials": 8, "min_budget": 2.0,
                    "max_budget": 2.0, "cohort_width": "4"}
  else:
    st.nas.study = {"num_trials": 32}
  # ---- hpo: the winner's hyperparameters ------------------------------------------------
  st.hpo = ml_collections.ConfigDict({"type": "hpo"})
  if smoke:
    st.hpo.study = {"algorithm": "random", "num_trials": 8, "min_budget": 2.0,
                    "max_budget": 2.0, "cohort_width": "4"}
  else:  # TPE, every trial at the full budget (min_budget = max_budget = 9)
    st.hpo.study = {"algorithm": "tpe", "num_trials": 16, "min_budget": 9.0}
  # ---- autofis: which field pairs interact ----------------------------------------------
  st.autofis = ml_collections.ConfigDict({"type": "autofis", "planted_share": 0.5})
  # The settings tests/structure/autofis_test.py recovers the planted pairs with.
  st.autofis.embed_dim = 4
  st.autofis.batch_size = 512
  st.autofis.search_steps = 300 if smoke else 600
  st.autofis.warmup_steps = 75 if smoke else 150  # every gate on, before gRDA starts pruning
  st.autofis.retrain_steps = 100 if smoke else 400
  st.autofis.grda_c = 0.02  # sparser gates: a kept set comparable with the two planted pairs
  # ---- autogroup (not in the default order; add it with --config.pipeline.order=...) ----
  st.autogroup = ml_collections.ConfigDict({"type": "autogroup", "embed_dim": 4, "max_order": 3})
  st.autogroup.num_groups, st.autogroup.mlp_dims = 4, (64,)
  st.autogroup.steps = 40 if smoke else 1500
  # ---- fully_train: the chosen model through the CTR trainer (checkpointed) -------------
  st.fully_train = ml_collections.ConfigDict({"type": "fully_train"})
  if smoke:  # the library's recipe trains 3000 steps of 1024, one eval at the end
    st.fully_train.trainer = {"train": {"steps": 120, "batch_size": 512, "eval_every": 120,
                                        "log_every": 40},
                              "checkpoint": {"every_steps": 40}}
  # ---- baseline: the unsearched default DeepFM through fully_train's recipe (the default
  # recipe_step) ---------------------------------------------------------------------------
  st.baseline = ml_collections.ConfigDict({"type": "baseline"})

  c.report = ml_collections.ConfigDict()
  c.report.bootstrap_resamples = 200 if smoke else 1000  # paired bootstrap of final - baseline AUC
  c.report.bootstrap_seed = 0
  return c
