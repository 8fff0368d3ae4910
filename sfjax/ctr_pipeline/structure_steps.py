"""The CTR pipeline's interaction-structure steps: AutoFIS (`autofis`), AutoGroup (`autogroup`).

Each step's block holds the settings fields it sets (`AutoFISSettings` /
`AutoGroupSettings`; others keep their defaults). AutoFIS's block also has
`planted_share`: on synthetic data the kept pairs are scored
against the planted FM's dominant pairs (`autofis.planted_pairs`) that carry this
share of its pairwise variance. The task is the pipeline's shared `task` block,
so AutoFIS selects on the same validation rows as the searches and never sees
the pipeline's test split; its step metrics are valid-half ones (`valid_auc`,
`search_auc`: one selection split, issue #26; the result's test-half figures stay in
its `autofis` output). Output: `kept_pairs` (what `fully_train` restricts
the chosen model to) and the full `autofis` result. AutoGroup hands on
`field_groups` ({order: [[field, ...], ...]}) and its full result; no later step
consumes the groups yet (the block generator has no grouped-interaction block).

Neither keeps intermediate state: an interrupted step reruns from the start (its
seeds fix the result).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

from sfjax.automl.pipeline import StepContext, StepKind, StepOutput
from sfjax.core.errors import ConfigError
from sfjax.ctr_search import search_config
from sfjax.structure import autofis, autogroup


def _settings_from_block(cls, block, field: str, own: tuple[str, ...] = ("type",)):
  """`cls(**fields)` from the step block's fields named like the dataclass's fields.

  `own` names the block's other fields (the step's own, e.g. `type`).

  Raises:
    ConfigError: naming `<field>.<name>` for an unknown setting, or `<field>` with
      the dataclass's own message for a bad value.
  """
  known = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(block) - known - set(own))
  if unknown:
    raise ConfigError(f"config field {field}.{unknown[0]}: no such {cls.__name__} field "
                      f"(known: {', '.join(sorted(known))})")
  values: dict[str, Any] = {k: block[k] for k in known if k in block}
  for key in ("mlp_dims", "num_groups"):
    if isinstance(values.get(key), (list, tuple)):
      values[key] = tuple(values[key])
  try:
    return cls(**values)
  except (TypeError, ValueError) as e:
    raise ConfigError(f"config field {field}: {e}") from None


def _autofis_settings(block, field: str) -> autofis.AutoFISSettings:
  """The `AutoFISSettings` of a step block (`_settings_from_block`)."""
  return _settings_from_block(autofis.AutoFISSettings, block, field, own=("type", "planted_share"))


def _check_autofis(block, field: str) -> None:
  _autofis_settings(block, field)
  share = block.get("planted_share", 0.5)
  if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
    raise ConfigError(f"config field {field}.planted_share: must be in (0, 1], got {share!r}")


def _task(ctx: StepContext):
  # AutoFIS / AutoGroup train their own step counts on one full table: no touched-rows tables.
  task = {**ctx.config.task.to_dict(), "compact_rows": False}
  return search_config.make_task(ml_collections.ConfigDict({"seed": ctx.config.seed, "task": task}))


def _run_autofis_step(ctx: StepContext) -> StepOutput:
  """Runs AutoFIS on the pipeline's task; hands on `kept_pairs`."""
  settings = _autofis_settings(ctx.block, ctx.spec.field)
  task = _task(ctx)
  result = autofis.run_autofis(task, settings)
  # Valid-half metrics only: one selection split, no test AUC before the final model's.
  metrics = {"valid_auc": result.valid_auc, "search_auc": result.search_auc,
             "num_kept_pairs": len(result.kept_pairs), "num_pairs": len(result.all_pairs)}
  if task.data.format == "synthetic":
    truth = autofis.planted_pairs(task.data, task.seed, share=ctx.block.get("planted_share", 0.5))
    precision, recall = autofis.pair_precision_recall(result.kept_pairs, truth)
    metrics.update(planted_precision=precision, planted_recall=recall,
                   num_planted_pairs=len(truth))
  output = {"kept_pairs": [list(p) for p in result.kept_pairs], "autofis": result.to_json()}
  return StepOutput(metrics, output)


def _run_autogroup_step(ctx: StepContext) -> StepOutput:
  """Runs AutoGroup on the pipeline's task; hands on `field_groups`."""
  settings = _settings_from_block(autogroup.AutoGroupSettings, ctx.block, ctx.spec.field)
  result = autogroup.run_autogroup(_task(ctx), settings).to_json()
  sizes = [len(g) for groups in result["groups"].values() for g in groups]
  metrics = {"valid_auc": result["valid_auc"], "num_groups": len(sizes),
             "mean_group_size": sum(sizes) / max(len(sizes), 1)}
  return StepOutput(metrics, {"field_groups": result["groups"], "autogroup": result})


def structure_step_kinds() -> dict[str, StepKind]:
  """{'autofis', 'autogroup'}: the interaction-structure step kinds."""
  return {"autofis": StepKind(_run_autofis_step, _check_autofis,
                              "AutoFIS: gated field pairs (gRDA), retrain on the kept ones"),
          "autogroup": StepKind(
              _run_autogroup_step,
              lambda block, field: _settings_from_block(autogroup.AutoGroupSettings, block, field),
              "AutoGroup: learned field groups per interaction order")}
