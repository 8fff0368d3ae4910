"""PBT inside a study: clip bounds from the space, one population trained and told together."""

import math

import pytest

from experiments.configs import search_ctr
from search_spaces.ctr import SEARCH_SPACE
from sfjax.automl import PBT
from sfjax.automl.algorithms import TrialStatus
from sfjax.automl.space import Fixed, Float, Space
from sfjax.automl.study import Study
from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts.cohort_runner import CohortRunner
from sfjax.ctr_search import search_config, search_loop, search_pbt, search_round

ARCH = {"model.name": "fm", "model.embed_dim": 4, "embedding.optimizer": "adagrad"}
POPULATION, ROUNDS, STEPS_PER_ROUND = 4, 2, 2


def test_pbt_bounds_are_the_space_bounds_from_zero_where_allowed():
  space = Space({"model.name": Fixed("fm"), "embedding.learning_rate": Float(0.01, 0.1, log=True),
                 "optimizer.weight_decay": Float(1e-6, 1e-2, log=True)})
  assert search_pbt.pbt_bounds(space) == {"embedding.learning_rate": (0.01, 0.1),
                                          "optimizer.weight_decay": (1e-6, 1e-2)}
  assert search_pbt.pbt_bounds(space, frozenset({"optimizer.weight_decay"})) == {
      "embedding.learning_rate": (0.01, 0.1), "optimizer.weight_decay": (0.0, 1e-2)}


def test_pbt_bounds_of_the_ctr_space():
  bounds = search_pbt.pbt_bounds(SEARCH_SPACE.fixed_arch_space(ARCH), SEARCH_SPACE.zero_allowed)
  assert set(bounds) == set(arch_lib.DYNAMIC_KEYS)  # gates (Bool) and Fixed keys are not bounds
  assert bounds["embedding.learning_rate"] == (1e-3, 0.5)
  assert bounds["optimizer.learning_rate"] == (1e-4, 1e-2)
  assert bounds["embedding.init_stddev"] == (1e-3, 0.1)
  assert bounds["embedding.l2"] == (0.0, 1e-3)  # gated: a member without L2 keeps 0
  assert bounds["optimizer.weight_decay"] == (0.0, 1e-2)


@pytest.fixture(scope="module")
def runner():
  c = search_ctr.get_config("smoke")
  s = c.task.data.synthetic
  s.num_train, s.num_eval, s.cardinality_scale = 4096, 2048, 1e-4
  c.task.batch_size, c.task.eval_rows, c.task.eval_batch_size = 64, 1024, 1024
  return CohortRunner(search_config.make_task(c), cohort_width=POPULATION)


class _BrokenRunner(CohortRunner):
  """The real runner whose program call fails."""

  def run_stacked(self, *args, **kwargs):
    raise RuntimeError("device lost")


def _run(path, runner, runner_config=SEARCH_SPACE.runner_config, num_rounds=ROUNDS):
  """Asks one population from a fresh study in `path`, runs it; returns the study's trials."""
  space = SEARCH_SPACE.fixed_arch_space(ARCH)
  algorithm = PBT(population_size=POPULATION, seed=0)
  with Study.open(str(path), space, algorithm, search_loop.OBJECTIVE,
                  search_loop.DIRECTIONS) as study:
    members = study.ask(POPULATION)
    assert len(members) == POPULATION
    chunks = search_pbt.run_population(
        study, runner, members, [search_round.trial_seed(0, m.trial_id) for m in members],
        num_rounds, STEPS_PER_ROUND, (0, members[0].trial_id),
        search_pbt.pbt_bounds(space, SEARCH_SPACE.zero_allowed), runner_config)
    # One program call per round over the whole population, unless the population failed.
    assert chunks == [] or [(c.lanes, c.starts[0], c.ends[0]) for c in chunks] == [
        (POPULATION, r * STEPS_PER_ROUND, (r + 1) * STEPS_PER_ROUND) for r in range(num_rounds)]
    return study.trials()


def test_every_member_is_told_done_with_its_final_hyperparameters(tmp_path, runner):
  trials = _run(tmp_path, runner)
  assert len(trials) == POPULATION
  params = float(runner.costs.count_params(arch_lib.split_config(ARCH)[0]))
  for t in trials:
    m = t.metrics
    assert t.status == TrialStatus.DONE, t.reason
    assert 0.0 < m["auc"] < 1.0 and 0.0 < m["test_auc"] < 1.0
    assert m["steps"] == ROUNDS * STEPS_PER_ROUND and m["params"] == params
    assert {f"final.{k}" for k in arch_lib.DYNAMIC_KEYS} <= set(m)
    assert all(math.isfinite(m[f"final.{k}"]) for k in arch_lib.DYNAMIC_KEYS)


def test_a_single_round_member_that_diverges_is_told_failed(tmp_path, runner):
  calls = []

  def diverge_first(config):
    """The space's runner keys; the first member (mapped first) gets a diverging learning rate."""
    keys = SEARCH_SPACE.runner_config(config)
    if not calls:
      keys["embedding.learning_rate"] = 1e30  # outside the space: only to make it diverge
    calls.append(config)
    return keys

  trials = _run(tmp_path, runner, diverge_first, num_rounds=1)  # one round: no exploit rescues it
  assert len(calls) == POPULATION
  statuses = [t.status for t in trials]
  assert statuses == [TrialStatus.FAILED] + [TrialStatus.DONE] * (POPULATION - 1)
  failed = trials[0]
  assert "non-finite" in failed.reason
  assert "auc" not in failed.metrics and "test_auc" not in failed.metrics
  assert failed.metrics["steps"] < STEPS_PER_ROUND  # stopped at the first non-finite step
  assert failed.metrics["final.embedding.learning_rate"] == pytest.approx(1e30, rel=1e-6)


def test_a_runner_failure_fails_every_member(tmp_path, runner):
  broken = _BrokenRunner(runner.task, cohort_width=POPULATION, data=runner.data)
  trials = _run(tmp_path, broken)
  assert len(trials) == POPULATION
  for t in trials:
    assert t.status == TrialStatus.FAILED and t.reason == "RuntimeError: device lost"
    assert dict(t.metrics) == {}
