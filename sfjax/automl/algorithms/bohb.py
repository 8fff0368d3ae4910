"""BOHB (Falkner et al. 2018, arXiv 1807.01774): Hyperband whose new configs come from TPE.

The bracket schedule, promotions and resumes are Hyperband's (`hyperband.py`). Only
the configs that start a bracket differ: with probability `random_fraction` (BOHB's
rho = 1/3) a random sample, else one drawn by Optuna's TPE sampler fitted on the
results of the **largest budget that has at least `n_min` finished trials**, so the
model learns from the most faithful budget that has enough data. Until any budget
has `n_min` results, every new config is random. `n_min` is `n_startup_trials`, or
(when 0) the space's dimension + 1 as in the paper.

The model is rebuilt at each ask from the searcher's history (as `optuna_search`
does), with configs already proposed in the same ask and pending trials of that
budget shown as RUNNING (constant liar), so a restored searcher asks what the
original would have.

`ask(n, fixed)`: random new configs sample `space.fixing(fixed)`; model-based ones
come from TPE fitted on the model budget's results (all of them) with the fixed
keys held (`optuna_search.hold_fixed`); promotions keep their configs.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from sfjax.automl.algorithms import optuna_search
from sfjax.automl.algorithms.base import Searcher, TrialStatus
from sfjax.automl.algorithms.hyperband import BracketSearcher, Hyperband


@dataclasses.dataclass(frozen=True)
class BOHB(Hyperband):
  """Hyperband brackets; new configs from TPE on the largest well-populated budget."""

  name: ClassVar[str] = "bohb"
  n_startup_trials: int = 0
  random_fraction: float = 1 / 3

  def __post_init__(self):
    if isinstance(self.n_startup_trials, bool) or not isinstance(self.n_startup_trials, int) \
        or self.n_startup_trials < 0:
      raise ValueError(f"BOHB.n_startup_trials: must be an integer >= 0, got "
                       f"{self.n_startup_trials!r}")
    if not 0 <= self.random_fraction <= 1:
      raise ValueError(f"BOHB.random_fraction: must be in [0, 1], got {self.random_fraction!r}")

  def searcher(self, space, objective, budgets, brackets) -> Searcher:
    """Hyperband's schedule with BOHB's model-based first-rung configs."""
    return _BOHBSearcher(self, space, objective, budgets, brackets)

  def make_sampler(self, seed: int):
    """The TPE sampler fitted at one ask (all its trials are the model budget's)."""
    import optuna  # pylint: disable=g-import-not-at-top
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=0, multivariate=True,
                                      group=True, constant_liar=True)


class _BOHBSearcher(BracketSearcher):
  """Hyperband's brackets with BOHB's model-based first-rung configs."""

  spec: BOHB

  @property
  def n_min(self) -> int:
    """Finished trials a budget needs before the model is fitted on it."""
    return self.spec.n_startup_trials or len(self.space.keys) + 1

  def model_budget(self):
    """The largest budget with at least `n_min` finished (DONE) trials, or None."""
    counts: dict[float, int] = {}
    for r in self._history:
      budget = r.suggestion.budget  # set on every suggestion of a bracket
      if r.status == TrialStatus.DONE and budget is not None:
        counts[budget] = counts.get(budget, 0) + 1
    ready = [b for b, n in counts.items() if n >= self.n_min]
    return max(ready) if ready else None

  def _new_configs(self, count: int, asked: list) -> list:
    budget = self.model_budget()
    out = []
    space = self.sampling_space
    if budget is None:
      return [space.sample(self._rng) for _ in range(count)]
    results = [r for r in self._history if r.suggestion.budget == budget]
    pending = [s.config for s in self._pending.values() if s.budget == budget] + list(asked)
    with optuna_search.quiet_optuna() as optuna:
      study = None
      for _ in range(count):
        if self._rng.random() < self.spec.random_fraction:
          out.append(space.sample(self._rng))
          continue
        if study is None:
          sampler = self.spec.make_sampler(int(self._rng.integers(2**31 - 1)))
          study = optuna_search.rebuilt_study(optuna, self.space, self.objective, sampler,
                                              results, pending)
          optuna_search.hold_fixed(study, self.space, self.ask_fixed)
        out.append(optuna_search.ask_config(optuna, study, self.space, self._rng, space))
    return out
