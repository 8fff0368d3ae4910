"""Population-based training inside a durable study (`study.algorithm = 'pbt'`).

PBT (Jaderberg et al. 2017) tunes the dynamic hyperparameters of one
architecture while training: the population is one vmapped cohort
(`sfjax.cohorts.pbt_population.run_pbt`), and every `study.pbt.pbt_interval` budget
units the worst quarter copies the state of a top-quarter member and perturbs
its hyperparameters.

In the study, a member is a trial: its config is the architecture (as `Fixed`
keys) plus the member's *initial* hyperparameters, drawn at random (`sfjax.automl.PBT`) over
the space's `fixed_arch_space`; its metrics are the final held-out AUC and
steps plus `final.<key>`, the hyperparameters it ended with (exploit / explore
change them during the run). A population is asked as one batch and told
together; a population killed mid-run is re-queued by the study and rerun from
its start on resume (its members' results are told only once it finishes).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from absl import logging

from sfjax.automl.algorithms import Suggestion, TrialStatus
from sfjax.automl.space import Float, Int, Space
from sfjax.automl.study import Study
from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts.chunk_plan import Chunk
from sfjax.cohorts.cohort_runner import CohortRunner
from sfjax.cohorts.pbt_population import run_pbt


def pbt_bounds(space: Space, zero_allowed=frozenset()) -> dict[str, tuple[float, float]]:
  """Clip range of each explored hyperparameter: the space's bounds, from 0 for the keys
  in `zero_allowed` (gated regularisers: a member without one keeps 0.0; 0 * factor = 0)."""
  out: dict[str, tuple[float, float]] = {}
  for k in arch_lib.DYNAMIC_KEYS:
    if k not in space:
      continue
    param = space[k]
    if not isinstance(param, (Int, Float)):
      raise ValueError(f"search space: PBT explores {k!r}, so it must be Int or Float, "
                       f"not {type(param).__name__}")
    out[k] = (0.0 if k in zero_allowed else param.low, param.high)
  return out


def run_population(study: Study, runner: CohortRunner, members: Sequence[Suggestion],
                   seeds: Sequence[int], num_rounds: int, steps_per_round: int,
                   rng_seed: Sequence[int], bounds: dict[str, tuple[float, float]],
                   runner_config: Callable[[Any], dict[str, Any]], quantile: float = 0.25
                   ) -> list[Chunk]:
  """Trains `members` as one PBT population and tells the study each member's result.

  Args:
    study: the open study the members were asked from.
    runner: the task's CohortRunner.
    members: the population (configs of `fixed_arch_space`, one architecture).
    seeds: per member, its init seed.
    num_rounds, steps_per_round: PBT schedule (exploit / explore between rounds).
    rng_seed: seed of the exploit / explore decisions (a rerun decides the same).
    bounds: clip ranges of the explored hyperparameters (`pbt_bounds`).
    runner_config: the space's point -> trial runner keys (`CTRSearchSpace.runner_config`).
    quantile: PBT's exploit quantile.

  Returns:
    The program calls the population ran (one per round, `PBTHistory.chunks`);
    none when it failed.
  """
  splits = [arch_lib.split_config(runner_config(m.config)) for m in members]
  arch = splits[0][0]
  if any(a != arch for a, _ in splits):
    raise ValueError("a PBT population must share one architecture")
  hparams = {k: np.asarray([h[k] for _, h in splits], np.float32) for k in arch_lib.DYNAMIC_KEYS}
  started = time.perf_counter()
  try:
    history = run_pbt(runner, arch, hparams, seeds, num_rounds, steps_per_round,
                      np.random.default_rng(list(rng_seed)), quantile=quantile, bounds=bounds)
  except Exception as e:  # pylint: disable=broad-except  (never fatal to the study)
    logging.exception("PBT population of %d members (%s) failed", len(members), arch.describe())
    for m in members:
      study.tell(m.trial_id, {}, TrialStatus.FAILED, reason=f"{type(e).__name__}: {e}")
    return []
  seconds = (time.perf_counter() - started) / len(members)
  final = history.hparams[-1]
  for i, m in enumerate(members):
    auc = float(history.scores[-1, i])
    metrics = {"auc": auc, "test_auc": float(history.test_scores[-1, i]), "steps": float(history.steps[-1, i]),
               "params": float(runner.costs.count_params(arch)), "seconds": seconds,
               **{f"final.{k}": float(final[k][i]) for k in final}}
    if math.isfinite(auc):
      study.tell(m.trial_id, metrics, TrialStatus.DONE, elapsed_s=seconds)
    else:
      del metrics["auc"], metrics["test_auc"]
      study.tell(m.trial_id, metrics, TrialStatus.FAILED, elapsed_s=seconds,
                 reason="loss or parameters became non-finite")
  return list(history.chunks)
