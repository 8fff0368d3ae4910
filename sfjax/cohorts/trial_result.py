"""A trial's outcome in a cohort run, cut from its program call's stacked output.

DESIGN.md §4. `chunk_results` turns one `CohortOutput` (W lanes) into the
`CohortTrialResult`s of the chunk's real trials: exact host metrics, the mean train
loss over the applied steps, the cost metrics of each trial's own architecture,
an equal share of the call's wall time (compilation included), and the host
state to resume from. A non-finite trial fails alone (its mates are untouched);
a call that raised fails the whole chunk (`failed_chunk_results`). Every result
names the chunk that ran it (`chunk_plan.Chunk`), so what ran can be reported
from the results wherever they were computed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from sfjax.automl.algorithms import TrialStatus
from sfjax.cohorts.arch import ArchSpec
from sfjax.cohorts.chunk_plan import Chunk
from sfjax.cohorts.cohort_call import CohortOutput

CostsOf = Callable[[ArchSpec], dict[str, float]]


class CohortTrialResult(NamedTuple):
  """Outcome of one trial's run.

  Attributes:
    metrics: 'auc', 'logloss' (NaN when failed), 'train_loss' (mean over the
      applied steps of this run), 'steps' (global steps applied so far),
      'params' (`arch.count_params`), 'flops' (per example of the eval forward),
      'latency_ms' (only when the runner measures it), 'seconds' (share of the
      chunk's wall time).
    status: TrialStatus.DONE or TrialStatus.FAILED.
    state: host (numpy) TrainState to resume from; None when failed.
    error: why it failed, else None.
    chunk: the program call that ran it (`chunk_plan.Chunk`); None when it never
      reached one (e.g. its cohort run raised before).
    losses: [n] the train loss of each applied step of this run (float32; 'train_loss'
      is their mean); None when no call ran it.
  """

  metrics: dict[str, float]
  status: TrialStatus
  state: Any
  error: str | None
  chunk: Chunk | None = None
  losses: np.ndarray | None = None


def chunk_results(out: CohortOutput, chunk: Chunk, archs: Sequence[ArchSpec],
                  costs_of: CostsOf) -> list[CohortTrialResult]:
  """The results of `chunk`'s real trials from its call's output (padding lanes dropped).

  Args:
    out: the call's output over the chunk's W lanes, real trials first.
    chunk: the chunk the call ran.
    archs: per real trial, its own architecture (whose cost metrics it reports).
    costs_of: architecture -> its cost metrics (`TrialCosts.cost_metrics`).
  """
  num_real = len(chunk.trials)
  host_states = jax.device_get(out.states)
  results = []
  for i in range(num_real):
    losses = np.asarray(out.losses[i][out.applied[i]])
    metrics = {"auc": float(out.auc[i]), "logloss": float(out.logloss[i]),
               "test_auc": float(out.test_auc[i]), "test_logloss": float(out.test_logloss[i]),
               "train_loss": float(np.mean(losses)) if losses.size else float("nan"),
               "steps": int(out.steps[i]), **costs_of(archs[i]), "seconds": out.seconds / num_real}
    if out.alive[i]:
      state = jax.tree.map(lambda x, i=i: x[i].copy(), host_states)
      results.append(CohortTrialResult(metrics, TrialStatus.DONE, state, None, chunk, losses))
    else:
      results.append(CohortTrialResult(
          metrics, TrialStatus.FAILED, None,
          f"loss or parameters became non-finite at step {int(out.steps[i]) + 1}", chunk, losses))
  return results


def failed_chunk_results(error: BaseException, chunk: Chunk, archs: Sequence[ArchSpec],
                         params_of: Callable[[ArchSpec], int],
                         flops_of: Callable[[ArchSpec], float]) -> list[CohortTrialResult]:
  """FAILED results of `chunk`'s real trials after its call raised `error` (e.g. out of
  device memory): NaN metrics, each trial's `params` and `flops`, its start as `steps`."""
  nan = float("nan")
  return [CohortTrialResult({"auc": nan, "logloss": nan, "test_auc": nan, "test_logloss": nan,
                       "train_loss": nan, "steps": chunk.starts[i], "params": params_of(archs[i]),
                       "flops": flops_of(archs[i]), "seconds": 0.0},
                      TrialStatus.FAILED, None, f"{type(error).__name__}: {error}", chunk)
          for i in range(len(chunk.trials))]
