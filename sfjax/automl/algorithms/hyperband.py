"""Multi-fidelity search: successive halving, Hyperband and ASHA.

Rung budgets are `max_budget / eta^(K - k)` for k = 0..K, K = floor(log_eta(max /
min)) (so min_budget is rounded up onto the geometric ladder that ends exactly at
max_budget). A promotion is a new trial with the same config, the next rung's
budget (train up TO it), and `parent_trial_id = resume_from = ` the promoted trial,
so the runner continues from that trial's saved state.

- Successive halving (Jamieson & Talwalkar 2016): one bracket; rung i holds
  floor(n / eta^i) configs; rung i+1 starts when rung i has finished, with its top
  1/eta.
- Hyperband (Li et al. 2018, arXiv 1603.06560): brackets s = K..0 with
  n = ceil((K + 1) eta^s / (s + 1)) configs starting at rung K - s. Brackets are
  independent, so a batch is filled from later brackets while earlier ones wait.
- ASHA (Li et al. 2020, arXiv 1810.05934): asynchronous; a trial at rung k is
  promoted once it is in the top floor(|rung k| / eta) of the rung's finished
  trials; otherwise a new config starts at rung 0. Never finished by itself.

Failed / pruned trials rank last; rejected ones (quota filters) do not count and
are replaced. All rung tables are rebuilt from history + pending at each ask.

`ask(n, fixed)`: new configs (a bracket's first rung, ASHA's rung 0) are sampled
from `space.fixing(fixed)`; promotions keep their configs (they resume a trial).
Successive halving and Hyperband promote whole rungs, so a fixed batch may hold
promotions of other buckets, as a free one does. ASHA promotes during a fixed ask
only trials whose configs agree with `fixed` (`Config.agrees`); the others stay
eligible and are promoted by a later ask (a free one takes them first, highest
rung first). ASHA's promotion rule is "as soon as a worker asks"; deferring one
to the next ask keeps the rule and lets a batch share one shape bucket.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import ClassVar

from sfjax.automl.algorithms.base import (
    AlgorithmSpec,
    Objective,
    Searcher,
    Suggestion,
    TrialResult,
    TrialStatus,
)
from sfjax.automl.space import Space


def rung_budgets(min_budget: float, max_budget: float, eta: int) -> tuple[float, ...]:
  """Budgets of rungs 0..K: `max_budget / eta^(K - k)`, K = floor(log_eta(max / min)).

  Budgets that are whole numbers are returned as ints.
  """
  if isinstance(eta, bool) or not isinstance(eta, int) or eta < 2:
    raise ValueError(f"eta must be an int >= 2, got {eta!r}")
  if not 0 < min_budget <= max_budget:
    raise ValueError(f"need 0 < min_budget ({min_budget}) <= max_budget ({max_budget})")
  top = 0
  while max_budget / eta**(top + 1) >= min_budget * (1 - 1e-12):
    top += 1
  budgets = [max_budget / eta**(top - k) for k in range(top + 1)]
  return tuple(int(b) if float(b).is_integer() else b for b in budgets)


def hyperband_brackets(min_budget: float, max_budget: float,
                       eta: int) -> list[list[tuple[int, float]]]:
  """Hyperband's schedule: for s = K..0, the (num_configs, budget) of each rung.

  For R = 81, eta = 3 this is Table 1 of Li et al. (2018): s = 4 runs 81, 27, 9, 3, 1
  configs at budgets 1, 3, 9, 27, 81; ...; s = 0 runs 5 configs at budget 81.
  """
  budgets = rung_budgets(min_budget, max_budget, eta)
  top = len(budgets) - 1
  brackets = []
  for s in range(top, -1, -1):
    n = -(-(top + 1) * eta**s // (s + 1))  # ceil((K + 1) eta^s / (s + 1))
    brackets.append([(n // eta**i, budgets[top - s + i]) for i in range(s + 1)])
  return brackets


def _ranked(results) -> list[TrialResult]:
  """Successful results, best first (ties by trial id)."""
  return sorted((r for r in results if r.status == TrialStatus.DONE),
                key=lambda r: (r.loss, r.trial_id))


@dataclasses.dataclass(frozen=True)
class SuccessiveHalving(AlgorithmSpec):
  """One synchronous bracket of `num_configs` (default eta^K) from min to max budget."""

  name: ClassVar[str] = "successive_halving"
  multi_fidelity: ClassVar[bool] = True
  min_budget: float = 1
  max_budget: float = 81
  eta: int = 3
  num_configs: int | None = None
  seed: int = 0

  def build(self, space: Space, objective: Objective) -> Searcher:
    budgets = rung_budgets(self.min_budget, self.max_budget, self.eta)
    n = self.eta**(len(budgets) - 1) if self.num_configs is None else self.num_configs
    if n // self.eta**(len(budgets) - 1) < 1:
      raise ValueError(f"SuccessiveHalving.num_configs={n} leaves no config for the last rung "
                       f"of {budgets}; need >= {self.eta**(len(budgets) - 1)}")
    schedule = [(n // self.eta**i, b) for i, b in enumerate(budgets)]
    return BracketSearcher(self, space, objective, budgets, [schedule])


@dataclasses.dataclass(frozen=True)
class Hyperband(AlgorithmSpec):
  """`num_iterations` rounds of Hyperband's K + 1 brackets; finished after the last."""

  name: ClassVar[str] = "hyperband"
  multi_fidelity: ClassVar[bool] = True
  min_budget: float = 1
  max_budget: float = 81
  eta: int = 3
  num_iterations: int = 1
  seed: int = 0

  def build(self, space: Space, objective: Objective) -> Searcher:
    if self.num_iterations < 1:
      raise ValueError(f"{type(self).__name__}.num_iterations must be >= 1, got "
                       f"{self.num_iterations}")
    budgets = rung_budgets(self.min_budget, self.max_budget, self.eta)
    brackets = hyperband_brackets(self.min_budget, self.max_budget, self.eta)
    return self.searcher(space, objective, budgets, brackets * self.num_iterations)

  def searcher(self, space, objective, budgets, brackets) -> Searcher:
    """The searcher running `brackets` (BOHB swaps in its model-based one)."""
    return BracketSearcher(self, space, objective, budgets, brackets)


class BracketSearcher(Searcher):
  """Synchronous successive-halving brackets, each independent of the others."""

  def __init__(self, spec, space, objective, budgets, brackets):
    super().__init__(spec, space, objective)
    self._budgets = budgets
    # Per bracket, per rung: (num_configs, budget, global rung index).
    self._brackets = [[(n, b, budgets.index(b)) for n, b in schedule] for schedule in brackets]

  def _new_configs(self, count: int, asked: list) -> list:
    """`count` fresh configs for a bracket's first rung (Hyperband: random samples
    of `sampling_space`, the fixing during a fixed ask).

    `asked` holds the configs proposed earlier in the same ask (not yet pending).
    """
    del asked
    return [self.sampling_space.sample(self._rng) for _ in range(count)]

  @property
  def brackets(self) -> list[list[tuple[int, float]]]:
    """The schedule: per bracket, (num_configs, budget) of each rung."""
    return [[(n, b) for n, b, _ in schedule] for schedule in self._brackets]

  def _table(self):
    """(bracket, rung) -> [(suggestion, result or None)], rejected trials left out."""
    table: collections.defaultdict[tuple[int | None, int | None],
                                   list[tuple[Suggestion, TrialResult | None]]]
    table = collections.defaultdict(list)
    for r in self._history:
      if r.status != TrialStatus.REJECTED:
        table[(r.suggestion.bracket, r.suggestion.rung)].append((r.suggestion, r))
    for s in self._pending.values():
      table[(s.bracket, s.rung)].append((s, None))
    return table

  def _open_rung(self, bracket, table):
    """First unfinished rung of `bracket` as (rung, target, entries, ranked previous
    rung), or None when the bracket is finished."""
    ranked: list[TrialResult] = []
    for i, (n, _, rung) in enumerate(self._brackets[bracket]):
      entries = table[(bracket, rung)]
      target = n if i == 0 else min(n, len(ranked))
      if len(entries) < target or any(r is None for _, r in entries):
        return rung, target, entries, ranked
      ranked = _ranked(r for _, r in entries)
    return None

  @property
  def finished(self):
    table = self._table()
    return all(self._open_rung(b, table) is None for b in range(len(self._brackets)))

  def _propose(self, n):
    table = self._table()
    out: list[Suggestion] = []
    for bracket in range(len(self._brackets)):
      status = self._open_rung(bracket, table)
      if status is None:
        continue
      rung, target, entries, ranked = status
      room = min(target - len(entries), n - len(out))
      fields = dict(budget=self._budgets[rung], rung=rung, bracket=bracket)
      if rung == self._brackets[bracket][0][2]:
        out += [self._new_suggestion(config, **fields)
                for config in self._new_configs(max(room, 0), [s.config for s in out])]
      else:
        promoted = {s.parent_trial_id for s, _ in entries}
        chosen = [r for r in ranked[:target] if r.trial_id not in promoted][:max(room, 0)]
        out += [self._new_suggestion(r.suggestion.config, parent_trial_id=r.trial_id,
                                     resume_from=r.trial_id, **fields) for r in chosen]
      if len(out) >= n:
        break
    return out


@dataclasses.dataclass(frozen=True)
class ASHA(AlgorithmSpec):
  """Asynchronous successive halving (promote when in the top 1/eta of a rung)."""

  name: ClassVar[str] = "asha"
  multi_fidelity: ClassVar[bool] = True
  min_budget: float = 1
  max_budget: float = 81
  eta: int = 3
  seed: int = 0

  def build(self, space: Space, objective: Objective) -> Searcher:
    return _AshaSearcher(self, space, objective)


class _AshaSearcher(Searcher):
  spec: ASHA

  def __init__(self, spec: ASHA, space, objective):
    super().__init__(spec, space, objective)
    self.budgets = rung_budgets(spec.min_budget, spec.max_budget, spec.eta)

  def _propose(self, n):
    told = collections.defaultdict(list)
    for r in self._history:
      if r.status != TrialStatus.REJECTED:
        told[r.suggestion.rung].append(r)
    promoted = {s.resume_from for s in self._pending.values() if s.resume_from is not None}
    promoted |= {r.suggestion.resume_from for r in self._history
                 if r.suggestion.resume_from is not None}
    out = []
    for _ in range(n):
      out.append(self._promotion(told, promoted) or self._new_suggestion(
          self.sampling_space.sample(self._rng), budget=self.budgets[0], rung=0))
    return out

  def _promotion(self, told, promoted):
    """Promotes the best eligible trial of the highest possible rung, or None; during a
    fixed ask only trials whose configs agree with the fixed keys are eligible."""
    fixed = self.ask_fixed
    for rung in range(len(self.budgets) - 2, -1, -1):
      top = _ranked(told[rung])[:len(told[rung]) // self.spec.eta]
      for r in top:
        if r.trial_id not in promoted and r.suggestion.config.agrees(fixed):
          promoted.add(r.trial_id)
          return self._new_suggestion(r.suggestion.config, budget=self.budgets[rung + 1],
                                      rung=rung + 1, parent_trial_id=r.trial_id,
                                      resume_from=r.trial_id)
    return None
