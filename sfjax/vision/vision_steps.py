"""The image pipeline's step kinds (`VISION_STEP_KINDS`) and its report fields.

VEGA beyond CTR (arXiv 2011.01507) on `sfjax.automl.pipeline`; shared blocks in
`vision_task.py`. Searches select on the valid split; only the final numbers read test.

  darts        first-order DARTS on the supernet -> `genotype`, `supernet_spec`.
  hpo          learning rate / weight decay of the latest model (the derived network
               after `darts`, else the baseline CNN) by an `sfjax.automl` algorithm;
               each round of suggestions trains as one vmap -> `best_hparams`.
  augment      PBA: PBT over a vmapped population of policies -> `augment_schedule`.
  fully_train  the latest model with the recipe (+ `best_hparams`, + the schedule),
               from scratch; and the unsearched baseline CNN with the plain recipe:
               `final_test_accuracy` vs `baseline_test_accuracy`; saves the weights.
  compress     Prune-EA / Quant-EA on the latest trained CNN -> size-vs-accuracy fronts.

`hpo` keeps its trials in a study journal in the step's directory, so an interrupted
hpo resumes without training its told trials again; the other steps are short and
deterministic, so an interrupted one is rerun from its start (the engine skips the
finished ones).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from sfjax.automl import algorithms, pareto_evolution, space
from sfjax.automl.algorithms import ENDED_STATUSES
from sfjax.automl.pipeline import StepContext, StepKind, StepOutput, StepResult
from sfjax.automl.study import Study
from sfjax.core import names
from sfjax.core.errors import ConfigError
from sfjax.vision import augment, augment_search, cnn, compression, darts, training, vision_task
from sfjax.vision import conv_layers as layers
from sfjax.vision.vision_task import require

_PARAMS_FILE = "model.npz"


# ---- darts -------------------------------------------------------------------------
_DARTS_FIELDS = ("channels", "num_cells", "num_nodes", "steps", "batch_size", "weights_lr",
                 "alpha_lr")


def _check_darts(block, field: str) -> None:
  require(block, field, _DARTS_FIELDS)
  for key in ("channels", "num_cells", "num_nodes", "steps", "batch_size"):
    if int(block[key]) < 1:
      raise ConfigError(f"config field {field}.{key}: must be >= 1, got {block[key]!r}")


def run_darts(ctx: StepContext) -> StepOutput:
  """DARTS search; hands on the genotype and the supernet's static spec."""
  b, splits = ctx.block, vision_task.splits_of(ctx.config)
  spec = darts.SupernetSpec(int(b.channels), int(b.num_cells), int(b.num_nodes),
                            splits.train_x.shape[-1], 10)
  state, metrics = darts.run_darts_search(splits, spec, int(b.steps), int(b.batch_size),
                                    float(b.weights_lr), float(b.alpha_lr), int(ctx.config.seed))
  genotype = darts.discretize(state.alpha, spec.num_nodes)
  return StepOutput(metrics, {"genotype": [[list(p) for p in node] for node in genotype],
                              "supernet_spec": spec._asdict(),
                              "alpha": np.asarray(state.alpha).round(4).tolist()})


def _number(key: str, value: Any) -> float:
  """A searched hyperparameter's value as a float; ValueError naming it otherwise."""
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise ValueError(f"hpo: best trial's {key} = {value!r} is not a number")
  return float(value)


def _latest_model(ctx: StepContext) -> vision_task.Model:
  """The derived network of the latest `genotype`, else the baseline CNN."""
  genotype = ctx.latest("genotype", None)
  if genotype is None:
    return vision_task.baseline_model(ctx.config)
  return vision_task.darts_model(genotype, ctx.latest("supernet_spec"))


# ---- hpo ---------------------------------------------------------------------------
_HPO_FIELDS = ("algorithm", "num_trials", "width", "steps", "learning_rate", "weight_decay")


def _check_hpo(block, field: str) -> None:
  require(block, field, _HPO_FIELDS)
  names.lookup(algorithms.ALGORITHMS, block.algorithm, f"{field}.algorithm", "algorithm")
  for key in ("learning_rate", "weight_decay"):
    rng = tuple(block[key])
    if len(rng) != 2 or not 0 < rng[0] < rng[1]:
      raise ConfigError(f"config field {field}.{key}: expected (low, high) with 0 < low < high, "
                        f"got {rng}")
  if int(block.width) < 2 or int(block.num_trials) < 1:
    raise ConfigError(f"config field {field}.width / num_trials: width >= 2 (the recipe's own "
                      f"values take one lane), num_trials >= 1")


def run_hpo(ctx: StepContext) -> StepOutput:
  """Rounds of `width` lanes: lane 0 the recipe's own values, the rest suggestions.

  The trials live in an `sfjax.automl.Study` journal in the step's directory, so a
  step interrupted mid-way resumes: told trials are not trained again, and the
  algorithm continues from its journaled state (`trials.jsonl` / `best.json` are
  exported at the end).
  """
  import jax  # the steps' device work; imported here so listing the kinds stays light
  b, splits = ctx.block, vision_task.splits_of(ctx.config)
  model, recipe = _latest_model(ctx), vision_task.recipe_of(ctx.config)
  (lr_low, lr_high), (wd_low, wd_high) = b.learning_rate, b.weight_decay
  search_space = space.Space({"learning_rate": space.Float(lr_low, lr_high, log=True),
                              "weight_decay": space.Float(wd_low, wd_high, log=True)})
  spec = algorithms.ALGORITHMS[b.algorithm](seed=int(ctx.config.seed))
  width, steps, num_trials = int(b.width), int(b.steps), int(b.num_trials)
  key = jax.random.key(int(ctx.config.seed))
  params0 = model.init(key)

  @jax.jit
  def lanes(lr, wd, x, y, vx, vy):
    def one(lr, wd):
      p, _ = training.fit(model.apply, params0, x, y, steps, recipe.batch_size, lr, wd, key)
      return training.accuracy(model.apply, p, vx, vy)
    return jax.vmap(one)(lr, wd)

  default = {"learning_rate": recipe.learning_rate, "weight_decay": recipe.weight_decay}

  def train_round(configs):  # lane 0 is the recipe's own values; fixed width: one compilation
    configs = [default, *configs] + [default] * (width - 1 - len(configs))
    return np.asarray(lanes(np.array([c["learning_rate"] for c in configs], np.float32),
                            np.array([c["weight_decay"] for c in configs], np.float32),
                            splits.train_x, splits.train_y, splits.valid_x, splits.valid_y))

  default_acc = None
  objective = algorithms.Objective("valid_accuracy", "maximize")
  with Study.open(ctx.workdir, search_space, spec, objective) as study:
    while (told := sum(t.status in ENDED_STATUSES for t in study.trials())) < num_trials:
      asked = study.ask(min(width - 1, num_trials - told))
      if not asked:
        break
      acc = train_round([dict(s.config) for s in asked])
      default_acc = float(acc[0])
      for s, a in zip(asked, acc[1:], strict=False):  # padding lanes past the asked ones
        study.tell(s.trial_id, {"valid_accuracy": float(a)})
    study.export()
    best, told = study.best(), sum(t.status in ENDED_STATUSES for t in study.trials())
  if best is None:
    raise RuntimeError(f"hpo: algorithm {b.algorithm!r} suggested no trial")
  if default_acc is None:  # every trial was told before this (resumed) run
    default_acc = float(train_round([])[0])
  best_acc = float(best.metrics["valid_accuracy"])
  chosen = ({k: _number(k, v) for k, v in dict(best.config).items()} if best_acc > default_acc
            else default)
  return StepOutput({"valid_accuracy": max(best_acc, default_acc), "default_valid_accuracy":
                     default_acc, "beats_default": best_acc > default_acc, "num_trials": told,
                     "model": model.kind},
                    {"best_hparams": chosen})


# ---- augment -----------------------------------------------------------------------
_AUGMENT_FIELDS = ("population", "intervals", "interval_steps", "fraction")


def _check_augment(block, field: str) -> None:
  require(block, field, _AUGMENT_FIELDS)
  if int(block.population) < 2 or not 0 < float(block.fraction) <= 0.5:
    raise ConfigError(f"config field {field}.population / fraction: population >= 2 and "
                      f"0 < fraction <= 0.5, got {block.population} / {block.fraction}")


def run_augment(ctx: StepContext) -> StepOutput:
  """PBA on the latest model with the recipe's optimizer settings."""
  b, splits = ctx.block, vision_task.splits_of(ctx.config)
  model = _latest_model(ctx)
  recipe = vision_task.recipe_of(ctx.config, ctx.latest("best_hparams", None))
  result = augment_search.pba_search(model.init, model.apply, splits, int(b.population),
                                     int(b.intervals), int(b.interval_steps), recipe.batch_size,
                                     recipe.learning_rate, recipe.weight_decay,
                                     int(ctx.config.seed), float(b.fraction))
  return StepOutput({"valid_accuracy": result.best_valid_accuracy,
                     "population_mean_valid_accuracy": float(result.valid_accuracy[-1].mean())},
                    {"augment_schedule": result.schedule.tolist(),
                     "augment_ops": list(augment.AUG_OPS)})


# ---- fully_train -------------------------------------------------------------------
def _check_fully_train(block, field: str) -> None:
  del block, field  # the recipe is the shared `recipe` block, checked when the step runs


def run_fully_train(ctx: StepContext) -> StepOutput:
  """The chosen model from scratch with the recipe, and the baseline with the plain recipe."""
  import jax
  splits, seed = vision_task.splits_of(ctx.config), int(ctx.config.seed)
  model = _latest_model(ctx)
  hparams = ctx.latest("best_hparams", None)
  schedule = ctx.latest("augment_schedule", None)
  recipe = vision_task.recipe_of(ctx.config, hparams)
  aug = None if schedule is None else augment.schedule_augment(
      np.asarray(schedule, np.int32), recipe.steps)
  params, final = training.fit_and_score(model.apply, model.init(jax.random.key(seed)), splits,
                                         recipe, seed, aug)
  vision_task.save_params(os.path.join(ctx.workdir, _PARAMS_FILE), params)
  searched = hparams is not None or schedule is not None or model.kind != "cnn"
  if searched:
    base = vision_task.baseline_model(ctx.config)
    base_params, baseline = training.fit_and_score(
        base.apply, base.init(jax.random.key(seed)), splits, vision_task.recipe_of(ctx.config),
        seed)
    base_size = layers.num_params(base_params)
  else:  # nothing searched: the final model is the baseline itself
    baseline, base_size = final, layers.num_params(params)
  metrics = {"final_test_accuracy": final["test_accuracy"],
             "baseline_test_accuracy": baseline["test_accuracy"],
             "final_valid_accuracy": final["valid_accuracy"],
             "baseline_valid_accuracy": baseline["valid_accuracy"],
             "final_params": layers.num_params(params), "baseline_params": base_size,
             "model": model.kind, "augmented": schedule is not None}
  return StepOutput(metrics, {"model_params": ctx.relative(os.path.join(ctx.workdir, _PARAMS_FILE)),
                              "model_kind": model.kind, "model_description": model.description,
                              "recipe": recipe._asdict()})


# ---- compress ----------------------------------------------------------------------
_COMPRESS_FIELDS = ("methods", "population", "generations", "finetune_steps", "finetune_lr",
                    "mutation_rate", "bit_choices", "max_accuracy_drop")


def _methods(block, field: str) -> list[str]:
  methods = [m.strip() for m in str(block.methods).split(",") if m.strip()]
  bad = [m for m in methods if m not in (compression.PRUNE, compression.QUANT)]
  if not methods or bad:
    raise ConfigError(f"config field {field}.methods: expected a comma-separated subset of "
                      f"'prune,quant', got {block.methods!r}")
  return methods


def _check_compress(block, field: str) -> None:
  require(block, field, _COMPRESS_FIELDS)
  _methods(block, field)
  if int(block.population) < 2 or int(block.generations) < 0:
    raise ConfigError(f"config field {field}.population / generations: population >= 2, "
                      f"generations >= 0")
  if not block.bit_choices or min(int(b) for b in block.bit_choices) < 2:
    raise ConfigError(f"config field {field}.bit_choices: bit widths >= 2, got "
                      f"{block.bit_choices!r}")


def _front_json(front: Sequence[pareto_evolution.Candidate],
                full_size: int) -> list[dict[str, Any]]:
  return [{"genome": list(c.genome), "size": c.cost, "size_ratio": c.cost / full_size,
           "valid_accuracy": c.valid, "test_accuracy": c.test} for c in front]


def _run_compress(ctx: StepContext) -> StepOutput:
  """Prune-EA and/or Quant-EA on the latest trained CNN; the first method's pick is final."""
  import jax
  b, splits, seed = ctx.block, vision_task.splits_of(ctx.config), int(ctx.config.seed)
  kind = ctx.latest("model_kind")
  if kind != "cnn":
    raise ConfigError(f"config field {ctx.spec.field}: compress needs a trained CNN (a "
                      f"fully_train of the baseline), the latest model is {kind!r}")
  model = vision_task.model_from_description(kind, ctx.latest("model_description"))
  params = vision_task.load_params(ctx.resolve(ctx.latest("model_params")),
                                   model.init(jax.random.key(0)))
  widths = cnn.widths_of(params)
  score = jax.jit(lambda p, x, y: training.accuracy(cnn.apply_cnn, p, x, y))
  ref_valid = float(score(params, splits.valid_x, splits.valid_y))
  ref_test = float(score(params, splits.test_x, splits.test_y))
  rng = np.random.default_rng(seed)
  metrics, fronts, picks = {"reference_valid_accuracy": ref_valid}, {}, {}
  for method in _methods(b, ctx.spec.field):
    evaluate = compression.make_evaluator(method, params, splits, int(b.finetune_steps),
                                          vision_task.recipe_of(ctx.config).batch_size,
                                          float(b.finetune_lr), seed)
    if method == compression.PRUNE:
      full = cnn.cnn_param_count(widths)
      size_of = functools.partial(compression.pruned_param_count, widths=widths)
      mutate = functools.partial(compression.mutate_masks, widths=widths,
                                 rate=float(b.mutation_rate))
      start = compression.random_masks(rng, widths, int(b.population))
    else:
      choices = [int(x) for x in b.bit_choices]
      full = 32 * sum(cnn.layer_weight_sizes(widths))
      size_of = functools.partial(compression.weight_bits, widths=widths)
      mutate = functools.partial(compression.mutate_bits, choices=choices,
                                 rate=float(b.mutation_rate))
      start = compression.random_bits(rng, choices, int(b.population))
    evaluated = pareto_evolution.evolve(start, evaluate, size_of, mutate, int(b.generations),
                                        rng)
    front = pareto_evolution.candidate_front(evaluated)
    pick = pareto_evolution.choose(front, ref_valid, float(b.max_accuracy_drop))
    fronts[method], picks[method] = _front_json(front, full), _front_json([pick], full)[0]
    metrics.update({f"{method}_size_ratio": pick.cost / full,
                    f"{method}_test_accuracy": pick.test,
                    f"{method}_evaluated": len(evaluated), f"{method}_front_size": len(front)})
    if method == compression.PRUNE:  # the pick, physically pruned: its size is exact
      small = cnn.prune_cnn(params, compression.split_masks(np.asarray(pick.genome), widths))
      metrics["prune_params"] = layers.num_params(small)
  first = picks[_methods(b, ctx.spec.field)[0]]
  metrics.update({"final_test_accuracy": first["test_accuracy"],
                  "baseline_test_accuracy": ref_test, "final_size_ratio": first["size_ratio"]})
  return StepOutput(metrics, {"compression_fronts": fronts, "compression_picks": picks})


# ---- registry and report -----------------------------------------------------------
VISION_STEP_KINDS = {
    "darts": StepKind(run_darts, _check_darts, "first-order DARTS supernet search -> genotype"),
    "hpo": StepKind(run_hpo, _check_hpo, "learning rate / weight decay of the latest model"),
    "augment": StepKind(run_augment, _check_augment, "PBA: PBT over augmentation policies"),
    "fully_train": StepKind(run_fully_train, _check_fully_train,
                            "the chosen model from scratch vs the unsearched baseline CNN"),
    "compress": StepKind(_run_compress, _check_compress,
                         "Prune-EA / Quant-EA on the trained CNN: size-vs-accuracy fronts"),
}


def vision_report(results: Sequence[StepResult], workdir: str) -> dict[str, Any]:
  """The report's fields: the newest done step's `final_test_accuracy` and
  `baseline_test_accuracy` (test split), and the compression fronts when there are any."""
  del workdir
  out: dict[str, Any] = {"final_test_accuracy": None, "baseline_test_accuracy": None,
                         "final_step": None, "compression_fronts": None}
  for r in reversed(results):
    if r.status == "done" and "final_test_accuracy" in r.best_metrics:
      out.update(final_test_accuracy=r.best_metrics["final_test_accuracy"],
                 baseline_test_accuracy=r.best_metrics["baseline_test_accuracy"],
                 final_step=r.name)
      break
  for r in reversed(results):
    if r.status == "done" and "compression_fronts" in r.output:
      out["compression_fronts"] = r.output["compression_fronts"]
      break
  return out
