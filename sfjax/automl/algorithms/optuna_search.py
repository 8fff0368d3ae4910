"""Model-based search through Optuna's samplers: TPE and GP (not rewritten here).

At every `ask(n)` a fresh in-memory Optuna study is rebuilt from the searcher's
history (finished trials via `optuna.trial.create_trial` + `study.add_trial`) and
pending trials (as RUNNING, which TPE's constant liar accounts for), with a sampler
seeded from the searcher's own generator. So the searcher's state is exactly
`history + pending + generator`, and a restored searcher proposes what the original
would have. Rebuilding costs about 0.2 ms per past trial (ask(1) after 500
trials: 110 ms here).

`space.suggest(trial)` suggests only active parameters, so conditional spaces work;
a suggestion that hits a forbidden clause is told to Optuna as FAIL and asked again
(after 10 in a row, a random allowed config is used instead).
Trials rejected by a quota filter are replayed as infeasible (Optuna's constraint
value 1.0 > 0), so TPE / GP learn to avoid those regions; without that TPE kept
proposing rejected configs (89% of asks on a toy study). Failed and pruned trials
are replayed as FAIL, which the samplers ignore, as Optuna does (as PRUNED without
intermediate values, TPE could count them in its 'good' group).

`ask(n, fixed)` (architecture-aware asking): the study is rebuilt from the whole
history as for a free ask, and its sampler wrapped in Optuna's
`PartialFixedSampler`: the model (TPE's Parzen estimators, the GP) is fitted on
every past trial, the fixed keys are left out of the relative (multivariate)
search space and answer their fixed value when suggested, and only the free keys
are sampled. The forbidden-clause fallback samples `space.fixing(fixed)`.

Optuna is imported on first use: importing `sfjax.automl` stays light.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import warnings
from typing import Any, ClassVar

from sfjax.automl.algorithms.base import AlgorithmSpec, Objective, Searcher, TrialStatus
from sfjax.automl.space import ForbiddenConfigError, Space

_FORBIDDEN_TRIES = 10


@dataclasses.dataclass(frozen=True)
class TPE(AlgorithmSpec):
  """Optuna's `TPESampler` (Bergstra et al. 2011), multivariate with constant liar."""

  name: ClassVar[str] = "tpe"
  seed: int = 0
  n_startup_trials: int = 10
  multivariate: bool = True
  constant_liar: bool = True

  def build(self, space: Space, objective: Objective) -> Searcher:
    return _OptunaSearcher(self, space, objective)

  def make_sampler(self, seed: int):
    """The Optuna sampler for one ask."""
    import optuna  # pylint: disable=g-import-not-at-top
    return optuna.samplers.TPESampler(
        seed=seed, n_startup_trials=self.n_startup_trials, multivariate=self.multivariate,
        group=self.multivariate, constant_liar=self.constant_liar,
        constraints_func=_stored_constraints)


@dataclasses.dataclass(frozen=True)
class GP(AlgorithmSpec):
  """Optuna's `GPSampler` (Gaussian process + log EI). Needs PyTorch installed.

  Optuna's GP models the parameters active in every trial; conditional ones are
  sampled independently.
  """

  name: ClassVar[str] = "gp"
  seed: int = 0
  n_startup_trials: int = 10

  def build(self, space: Space, objective: Objective) -> Searcher:
    if importlib.util.find_spec("torch") is None:
      raise ImportError("GP search uses optuna.samplers.GPSampler, which needs PyTorch; "
                        "`pip install torch` or use TPE")
    return _OptunaSearcher(self, space, objective)

  def make_sampler(self, seed: int):
    """The Optuna sampler for one ask."""
    import optuna  # pylint: disable=g-import-not-at-top
    return optuna.samplers.GPSampler(seed=seed, n_startup_trials=self.n_startup_trials,
                                     constraints_func=_stored_constraints)


def _stored_constraints(frozen_trial) -> tuple[float, ...]:
  """Optuna calls this only for trials told through the study, which we never do."""
  from optuna.samplers._base import _CONSTRAINTS_KEY  # pylint: disable=g-import-not-at-top
  return tuple(frozen_trial.system_attrs.get(_CONSTRAINTS_KEY, (0.0,)))


@contextlib.contextmanager
def quiet_optuna():
  """Silences Optuna's per-trial INFO logs and experimental-feature warnings."""
  import optuna  # pylint: disable=g-import-not-at-top
  verbosity = optuna.logging.get_verbosity()
  optuna.logging.set_verbosity(optuna.logging.WARNING)
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
      yield optuna
  finally:
    optuna.logging.set_verbosity(verbosity)


def rebuilt_study(optuna, space: Space, objective: Objective, sampler, results, pending_configs):
  """A fresh in-memory Optuna study holding `results` and `pending_configs`.

  Args:
    optuna: the imported module (inside `quiet_optuna()`).
    space, objective: the search's.
    sampler: the Optuna sampler the study asks with.
    results: told `TrialResult`s: DONE ones as COMPLETE with their objective,
      REJECTED ones as infeasible (constraint 1.0), the rest as FAIL.
    pending_configs: asked-but-not-told configs, as RUNNING (the constant liar).
  """
  # Pinned optuna 4.6: the system attribute the samplers read constraints from.
  from optuna.samplers._base import _CONSTRAINTS_KEY  # pylint: disable=g-import-not-at-top
  study = optuna.create_study(direction=objective.direction, sampler=sampler)
  state_of = optuna.trial.TrialState
  done = [objective.value(r.metrics) for r in results if r.status == TrialStatus.DONE]
  worst = (min(done) if objective.direction == "maximize" else max(done)) if done else 0.0
  for r in results:
    config = r.suggestion.config
    trial: dict[str, Any] = dict(params=space.optuna_params(config),
                                 distributions=space.optuna_distributions(config))
    if r.status == TrialStatus.DONE:
      trial.update(value=objective.value(r.metrics), state=state_of.COMPLETE,
                   system_attrs={_CONSTRAINTS_KEY: (0.0,)})
    elif r.status == TrialStatus.REJECTED:  # infeasible: the samplers learn to avoid it
      trial.update(value=worst, state=state_of.COMPLETE, system_attrs={_CONSTRAINTS_KEY: (1.0,)})
    else:
      trial.update(state=state_of.FAIL)
    study.add_trial(optuna.trial.create_trial(**trial))
  for config in pending_configs:
    study.add_trial(optuna.trial.create_trial(
        params=space.optuna_params(config), distributions=space.optuna_distributions(config),
        state=state_of.RUNNING))
  return study


def hold_fixed(study, space: Space, fixed) -> None:
  """Makes `study` ask with the keys of `fixed` held at their values.

  Wraps the study's sampler in `optuna.samplers.PartialFixedSampler` (a subclass:
  see `_held_sampler_class`; nothing to do for a free ask): the sampler still sees
  every trial of the study, but samples only the keys not in `fixed`.

  Args:
    study: a study from `rebuilt_study` (or the multi-objective one).
    space: the (unfixed) search space; its `Fixed` keys are never suggested.
    fixed: key -> value, already checked by `space.fixing`.
  """
  values = {k: v for k, v in fixed.items() if k in space.dims}
  if values:
    study.sampler = _held_sampler_class()(values, study.sampler)


def _held_sampler_class():
  """`PartialFixedSampler` that also drops held keys from relative samples.

  TPE with `group=True` samples every group it infers from the trials, ignoring the
  search space it is given, so the plain wrapper lets a held key through as a
  relative parameter (Optuna then raises 'sampled by `sample_relative` method but
  it is not contained in the relative search space'). The held key is dropped
  here: the free keys come from the joint model, marginalised over the held ones.
  """

  # Imported on use, as every optuna import here (it costs seconds).
  from optuna.samplers import PartialFixedSampler  # pylint: disable=g-import-not-at-top

  class HeldSampler(PartialFixedSampler):
    """Optuna's `PartialFixedSampler` whose relative samples leave the held keys out."""

    def sample_relative(self, study, trial, search_space):
      """The base sampler's relative sample without the held keys."""
      params = super().sample_relative(study, trial, search_space)
      return {k: v for k, v in params.items() if k not in self._fixed_params}

  return HeldSampler


def ask_config(optuna, study, space: Space, rng, fallback: Space | None = None):
  """One config from the study's sampler; it stays RUNNING in `study` (the liar sees it).

  A suggestion that hits a forbidden clause is told as FAIL and asked again; after
  `_FORBIDDEN_TRIES` in a row a random allowed config (from `rng`) of `fallback`
  (default `space`; a fixed ask passes its `space.fixing`) is used instead.
  """
  for _ in range(_FORBIDDEN_TRIES):
    trial = study.ask()
    try:
      return space.suggest(trial)
    except ForbiddenConfigError:
      study.tell(trial, state=optuna.trial.TrialState.FAIL)
  # The sampler ignores FAIL trials, so it may keep proposing forbidden values.
  config = (fallback or space).sample(rng)
  study.add_trial(optuna.trial.create_trial(
      params=space.optuna_params(config), distributions=space.optuna_distributions(config),
      state=optuna.trial.TrialState.RUNNING))
  return config



class _OptunaSearcher(Searcher):
  """Searcher driving an Optuna sampler through `study.ask()` / `space.suggest`.

  `ask(n, fixed)` fits the sampler on the whole history and samples only the free
  keys (`hold_fixed`).
  """

  spec: TPE | GP

  def _propose(self, n):
    with quiet_optuna() as optuna:
      sampler = self.spec.make_sampler(int(self._rng.integers(2**31 - 1)))
      study = rebuilt_study(optuna, self.space, self.objective, sampler, self._history,
                            [s.config for s in self._pending.values()])
      hold_fixed(study, self.space, self.ask_fixed)
      return [self._new_suggestion(ask_config(optuna, study, self.space, self._rng,
                                              self.sampling_space))
              for _ in range(n)]
