"""Population-based training (Jaderberg et al. 2017) on a vmapped population.

The whole population of P members is one cohort: each round is one program call
(`CohortRunner.run_stacked`) over P trials that continue from the stacked state
of the previous round. Between rounds, on the host, `pbt_exploit_explore`
decides from the members' eval AUCs; then

  exploit = `gather_members`: a gather along the trial axis of every leaf of the stacked state
            (parameters, optimizer state, embedding table and its slots, step),
  explore = the perturbed [P] hyperparameter arrays are passed to the next
            round, which writes the dense ones into the optax
            `inject_hyperparams` state and builds the row optimizer and the
            embedding L2 from them.

The state never leaves the device between rounds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from sfjax.automl.algorithms.pbt import gather_members, pbt_exploit_explore
from sfjax.cohorts import chunk_plan
from sfjax.cohorts.arch import ArchSpec
from sfjax.cohorts.chunk_plan import Chunk
from sfjax.cohorts.cohort_runner import CohortRunner
from sfjax.cohorts.shape_buckets import buckets


class PBTHistory(NamedTuple):
  """What a PBT run did.

  Attributes:
    scores: [R, P] eval AUC of each member after each round (NaN = failed), on the
      valid half of the eval rows (what exploit decides on).
    test_scores: [R, P] the same on the test half, which no decision sees.
    hparams: R dicts name -> [P], the hyperparameters each round ran with.
    source_index: [R - 1, P] the member each member continued from after each
      round but the last (itself unless exploited).
    steps: [R, P] global steps applied by each member after each round.
    final_states: the population's stacked [P] TrainState after the last round (device).
    chunks: R `chunk_plan.Chunk`s, the program call of each round (all P members,
      no padding), for what a search reports of the programs it ran.
  """

  scores: np.ndarray
  test_scores: np.ndarray
  hparams: list[dict[str, np.ndarray]]
  source_index: np.ndarray
  steps: np.ndarray
  final_states: Any
  chunks: tuple[Chunk, ...] = ()

  @property
  def best_member(self) -> int:
    """Index of the member with the best final score (failed members last)."""
    final = self.scores[-1]
    return int(np.argmax(np.where(np.isnan(final), -np.inf, final)))


def run_pbt(runner: CohortRunner, arch: ArchSpec, init_hparams: Mapping[str, Any], seeds: Sequence[int],
            num_rounds: int, steps_per_round: int, rng: np.random.Generator, *,
            quantile: float = 0.25, perturb: Sequence[float] = (0.8, 1.2),
            bounds=None) -> PBTHistory:
  """Trains a population of P members for `num_rounds` rounds of `steps_per_round` steps.

  Args:
    runner: the CohortRunner of the task.
    arch: the population's architecture.
    init_hparams: dynamic key (`arch.DYNAMIC_KEYS`) -> [P] initial values; these
      keys are explored, the others keep their defaults.
    seeds: [P] initialisation seeds.
    num_rounds: R >= 1.
    steps_per_round: train steps per round (>= 1).
    rng: the only randomness of the exploit/explore decisions.
    quantile, perturb, bounds: see `sfjax.automl.pbt_exploit_explore`
      (bounds: a Space or name -> (low, high)).

  Returns:
    PBTHistory.
  """
  seed_array = np.asarray(seeds, np.int32).reshape(-1)
  size = seed_array.shape[0]
  if num_rounds < 1 or steps_per_round < 1:
    raise ValueError(f"num_rounds and steps_per_round must be >= 1, got {num_rounds}, {steps_per_round}")
  hparams = {k: np.asarray(v, np.float32).reshape(-1) for k, v in init_hparams.items()}
  for name, values in hparams.items():
    if values.shape != (size,):
      raise ValueError(f"init_hparams[{name!r}] has {values.shape[0]} values but there are {size} seeds")
  states, scores, test_scores, used, sources, steps = None, [], [], [], [], []
  chunks = tuple(chunk_plan.whole_cohort(buckets.bucket_key(arch), size, r * steps_per_round,
                                         (r + 1) * steps_per_round, resume=r > 0)
                 for r in range(num_rounds))
  for r, chunk in enumerate(chunks):
    out = runner.run_stacked(arch, hparams, seed_array, chunk.starts[0], chunk.ends[0], states)
    scores.append(out.auc)
    test_scores.append(out.test_auc)
    used.append(hparams)
    steps.append(out.steps)
    states = out.states
    if r + 1 < num_rounds:
      source, hparams = pbt_exploit_explore(out.auc, hparams, rng, quantile=quantile, perturb=perturb,
                                            bounds=bounds, maximize=True)
      sources.append(source)
      states = gather_members(states, source)
  source_index = np.stack(sources) if sources else np.zeros((0, size), np.int64)
  return PBTHistory(np.stack(scores), np.stack(test_scores), used, source_index, np.stack(steps),
                    states, chunks)
