"""The CTR pipeline's step kinds: `ctr_step_kinds(spaces) -> {type: StepKind}`.

VEGA's CTR pipeline (arXiv 2011.01507) on `sfjax.automl.pipeline`:

  nas          `search_loop.run_search` over a whole space (`steps.<name>.search_space`
               names one of the spaces the application passes in, e.g. the named
               families or the block generator's); output: `best_config` (a point of
               the space), `search_space`, `pareto_front` (AUC up, parameters down).
               Hardware-aware (`select_within_auc` >= 0, with `study.objectives`
               holding `auc:max` and `latency_ms:min`): `best_config` is the fastest
               trial of the AUC-latency front within that much AUC of the front's best
               (`sfjax.automl.study.select_within_auc`; latencies measured on the
               serving forward, `study.latency_source`).
  hpo          `run_search` over `fixed_arch_space(arch_part(best_config))`: the
               hyperparameters of the previous step's architecture; its baseline
               ("default", `start_config_auc`) is that previous best, so
               `beats_default` says whether tuning helped.
  autofis      (`pipeline_steps_structure`) AutoFIS on the task: `kept_pairs`.
  autogroup    (`pipeline_steps_structure`) AutoGroup on the task.
  fully_train  (`pipeline_steps_train`) the chosen config through the CTR trainer.
  baseline     (`pipeline_steps_train`) the unsearched default through the same recipe.
  compress     (`pipeline_steps_compress`) Prune-EA (MLP neurons, embedding dims) of the
               trained model an earlier step handed on.

Shared blocks of the pipeline config: `seed` and `task` (the `CTRTask` every search
trial trains on, as in `sfjax.ctr_search.search_defaults()`). One selection split
(issue #26): searches select on, and compare with their default on, the first (valid)
half of the task's eval rows (`auc`, `default_auc`, `beats_default`); the pipeline's
final test split (`data.synthetic.test_rows`) is read only by `fully_train` / `baseline`,
and only the final model's test AUC is reported (with its interval).

A search step's block holds only overrides of its kind's library defaults
(`nas_defaults`, `hpo_defaults`: the `space` and `study` blocks of
`search_defaults()`); the pipeline engine merges them (`StepKind.defaults`).

Each search's study lives in its step directory, so an interrupted search resumes
from its journal when the pipeline is rerun.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import ml_collections

from sfjax.automl.pipeline import StepContext, StepKind, StepOutput
from sfjax.automl.study import select_within_auc
from sfjax.core import names
from sfjax.core.errors import ConfigError
from sfjax.ctr_pipeline import compress_step as pipeline_steps_compress
from sfjax.ctr_pipeline import structure_steps as pipeline_steps_structure
from sfjax.ctr_pipeline import train_steps as pipeline_steps_train
from sfjax.ctr_search import search_config, search_defaults, search_loop
from sfjax.ctr_search.space_provider import CTRSearchSpace


def nas_defaults() -> ml_collections.ConfigDict:
  """The library's `nas` block: the search's `space` and `study` defaults; `search_space`
  ('' here) must name one of the application's spaces; `select_within_auc` < 0 hands on
  the study's best trial, >= 0 the fastest front trial within that ΔAUC (module docstring)."""
  defaults = search_defaults()
  return ml_collections.ConfigDict({"search_space": "", "space": defaults.space,
                                    "study": defaults.study, "select_within_auc": -1.0})


def hpo_defaults() -> ml_collections.ConfigDict:
  """The library's `hpo` block: the search's `study` defaults (its space is the previous
  step's architecture)."""
  return ml_collections.ConfigDict({"study": search_defaults().study})


def _require(block, field: str, keys: tuple[str, ...]) -> None:
  for key in keys:
    if key not in block:
      raise ConfigError(f"config field {field}.{key}: missing")


def _search_config(ctx_config, space_block, study_block) -> ml_collections.ConfigDict:
  """The `run_search` config of one search step: the shared seed and task, its space and study."""
  c = ml_collections.ConfigDict()
  c.seed = ctx_config.seed
  c.task = ml_collections.ConfigDict(ctx_config.task.to_dict())
  c.space = ml_collections.ConfigDict(space_block)
  c.study = ml_collections.ConfigDict(study_block.to_dict())
  return c


def _check_study(config, field: str) -> None:
  try:
    search_config.check_study_settings(config)
  except search_config.SearchConfigError as e:
    message = str(e).removeprefix("config field ")  # the algorithm lookup's message has it
    raise ConfigError(f"config field {field}.{message}") from None


def _pareto_points(workdir: str) -> list[dict[str, Any]]:
  """The study's Pareto front (`best.json`'s trial ids) with each trial's config and metrics."""
  with open(os.path.join(workdir, "best.json"), encoding="utf-8") as f:
    front = set(json.load(f).get("pareto_front") or ())
  points = []
  with open(os.path.join(workdir, "trials.jsonl"), encoding="utf-8") as f:
    for line in f:
      trial = json.loads(line)
      if trial["trial_id"] in front:
        points.append({k: trial[k] for k in ("trial_id", "config", "metrics")})
  return points


def _search_output(summary: Mapping[str, Any], workdir: str, space_name: str) -> StepOutput:
  """A search step's report metrics and hand-off from `run_search`'s summary.

  Raises:
    RuntimeError: no trial finished (nothing to hand on).
  """
  if summary["best_config"] is None:
    raise RuntimeError(f"the search in {workdir} has no successful trial "
                       f"({summary['num_failed']} failed)")
  best, default = summary["best_metrics"], summary["default_metrics"]
  # One selection split (issue #26): 'auc' and 'default_auc' are the valid half of the task's
  # eval rows, which selected the trial and decides `beats_default`; no test AUC is reported
  # before the final model's.
  metrics = {"auc": best.get("auc"), "default_auc": default.get("auc"),
             "beats_default": summary["beats_default"],
             "num_trials": summary["num_trials_done"], "num_failed": summary["num_failed"]}
  output = {"best_config": summary["best_config"], "search_space": space_name,
            "best_trial_id": summary["best_trial_id"], "pareto_front": _pareto_points(workdir)}
  return StepOutput(metrics, output)


def _check_selection(block, field: str) -> None:
  """`select_within_auc`: a number; when >= 0 the study must maximise AUC and minimise
  latency_ms (the front it selects on)."""
  delta = block.get("select_within_auc", -1.0)
  if isinstance(delta, bool) or not isinstance(delta, (int, float)) or delta != delta:
    raise ConfigError(f"config field {field}.select_within_auc: expected a number, got {delta!r}")
  objective = search_config.make_objective(ml_collections.ConfigDict({"study": block.study}))
  wanted = {("auc", "maximize"), ("latency_ms", "minimize")}
  if delta >= 0 and not wanted <= {(o.metric, o.direction) for o in getattr(objective, "all", ())}:
    raise ConfigError(f"config field {field}.select_within_auc: {delta} selects on the "
                      "AUC-latency front; study.objectives must hold auc:max and latency_ms:min, "
                      f"got {block.study.get('objectives', '')!r}")


def select_fastest(output: StepOutput, delta: float) -> StepOutput:
  """A nas step's `output` with `best_config` the fastest `pareto_front` trial within
  `delta` AUC of the front's best (`select_within_auc`); its metrics gain the chosen
  trial's `auc` and `latency_ms` (`best_auc`: the study's best AUC) and `beats_default`
  compares the chosen trial's AUC with the default's.

  Raises:
    ValueError: an empty front, or a front trial without a finite auc / latency_ms.
  """
  chosen = select_within_auc(output.output["pareto_front"], delta)
  auc, default_auc = chosen["metrics"]["auc"], output.best_metrics.get("default_auc")
  metrics = {**output.best_metrics, "best_auc": output.best_metrics.get("auc"), "auc": auc,
             "latency_ms": chosen["metrics"]["latency_ms"], "select_within_auc": delta,
             "beats_default": bool(default_auc is not None and auc > default_auc)}
  return StepOutput(metrics, {**output.output, "best_config": chosen["config"],
                              "best_trial_id": chosen["trial_id"]})


class _SearchSteps:
  """nas / hpo over the spaces the application passes in."""

  def __init__(self, spaces: Mapping[str, CTRSearchSpace]):
    self.spaces = dict(spaces)

  def space(self, name: str, field: str) -> CTRSearchSpace:
    return names.lookup(self.spaces, name, field, "search space")

  def check_nas(self, block, field: str) -> None:
    _require(block, field, ("search_space", "space", "study"))
    self.space(block.search_space, f"{field}.search_space")
    config = ml_collections.ConfigDict({"seed": 0, "study": block.study.to_dict()})
    _check_study(config, field)
    _check_selection(block, field)

  def run_nas(self, ctx: StepContext) -> StepOutput:
    space = self.space(ctx.block.search_space, f"{ctx.spec.field}.search_space")
    config = _search_config(ctx.config, ctx.block.space.to_dict(), ctx.block.study)
    summary = search_loop.run_search(config, ctx.workdir, space)
    output = _search_output(summary, ctx.workdir, ctx.block.search_space)
    delta = ctx.block.get("select_within_auc", -1.0)
    return select_fastest(output, float(delta)) if delta >= 0 else output

  def check_hpo(self, block, field: str) -> None:
    _require(block, field, ("study",))
    config = ml_collections.ConfigDict({"seed": 0, "study": block.study.to_dict()})
    _check_study(config, field)

  def run_hpo(self, ctx: StepContext) -> StepOutput:
    space_name = ctx.latest("search_space")
    base = self.space(space_name, "search_space (output of an earlier step)")
    best = ctx.latest("best_config")
    space, start = _tuned_space(base, best)
    arch = base.arch_part(best)
    config = _search_config(ctx.config, {"fixed_arch": json.dumps(arch, sort_keys=True)},
                            ctx.block.study)
    summary = search_loop.run_search(config, ctx.workdir, space)
    result = _search_output(summary, ctx.workdir, space_name)
    return StepOutput({**result.best_metrics, "start_config_auc":
                       summary["default_metrics"].get("auc")}, result.output)


def _tuned_space(base: CTRSearchSpace, best: Mapping[str, Any]):
  """`base` narrowed to the hyperparameters of `best`'s architecture.

  Returns:
    (space, start): a `CTRSearchSpace` whose joint space is
    `base.fixed_arch_space(base.arch_part(best))` and whose default config is
    `best` itself (validated in that space), and that start config.
  """
  fixed = base.fixed_arch_space(base.arch_part(best))
  start = fixed.validate(dict(best))
  return base._replace(from_config=lambda _: fixed,
                       default_config=lambda space: (space or fixed).validate(dict(start))), start


def ctr_step_kinds(spaces: Mapping[str, CTRSearchSpace]) -> dict[str, StepKind]:
  """The CTR step registry for `sfjax.automl.pipeline.run_pipeline`.

  Args:
    spaces: search-space name -> `CTRSearchSpace` (the application's, e.g.
      `{'ctr': search_spaces.ctr.SEARCH_SPACE}`); steps name theirs in
      `steps.<name>.search_space`, and `fully_train` / `baseline` map configs with it.
  """
  search = _SearchSteps(spaces)
  kinds = {
      "nas": StepKind(search.run_nas, search.check_nas,
                      "architecture + hyperparameter search over a whole space", nas_defaults),
      "hpo": StepKind(search.run_hpo, search.check_hpo,
                      "hyperparameter search around the previous step's best architecture",
                      hpo_defaults),
  }
  kinds.update(pipeline_steps_train.train_step_kinds(spaces))
  kinds.update(pipeline_steps_structure.structure_step_kinds())
  kinds.update(pipeline_steps_compress.compress_step_kinds())
  return kinds
