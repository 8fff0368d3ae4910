"""Tests for PBT's spec, its exploit (decision and gather) and explore (sfjax/automl/algorithms/pbt.py)."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from sfjax.automl.algorithms import PBT, Objective, algorithm_from_dict, pbt_exploit_explore
from sfjax.automl.algorithms.pbt import exploit_sources, gather_members
from sfjax.automl.space import Float, Space

SCORES = np.array([0.1, 0.9, 0.5, 0.3, 0.8, 0.2, 0.7, 0.4])  # best: 1, 4; worst: 0, 5
LR = np.arange(1, 9) * 0.01


def test_bottom_quantile_copies_top_and_perturbs():
  sources, factors = set(), set()
  for seed in range(30):
    source, new = pbt_exploit_explore(SCORES, {"lr": LR}, np.random.default_rng(seed))
    assert source.shape == (8,) and source.dtype == np.int64
    for i in (1, 2, 3, 4, 6, 7):  # not in the bottom quarter: untouched
      assert source[i] == i and new["lr"][i] == LR[i]
    for i in (0, 5):
      assert source[i] in (1, 4)
      sources.add(int(source[i]))
      factor = new["lr"][i] / LR[source[i]]
      assert factor == pytest.approx(0.8) or factor == pytest.approx(1.2)
      factors.add(round(factor, 6))
  assert sources == {1, 4} and factors == {0.8, 1.2}


def test_minimize_nan_and_quantile():
  scores = np.array([3.0, np.nan, 1.0, 2.0])
  source, _ = pbt_exploit_explore(scores, {}, np.random.default_rng(0), quantile=0.5,
                                  maximize=False)
  # Best (lowest) two: members 2 and 3; worst two: NaN member 1 and member 0.
  assert source[2] == 2 and source[3] == 3
  assert source[0] in (2, 3) and source[1] in (2, 3)
  one, _ = pbt_exploit_explore([0.5], {"lr": np.array([0.1])}, np.random.default_rng(0))
  assert one.tolist() == [0]


def test_explore_is_clipped_to_bounds_and_keeps_dtypes():
  batch = np.array([64, 128, 32, 16, 256, 8, 64, 32], dtype=np.int32)
  space = Space({"lr": Float(0.01, 0.08)})
  for seed in range(20):
    source, new = pbt_exploit_explore(SCORES, {"lr": LR, "batch": batch},
                                      np.random.default_rng(seed), perturb=(0.5, 3.0),
                                      bounds={"batch": (8, 200)})
    assert new["batch"].dtype == np.int32
    for i in (0, 5):
      parent = batch[source[i]]
      assert new["batch"][i] in (np.clip(round(parent * 0.5), 8, 200),
                                 np.clip(round(parent * 3.0), 8, 200))
    _, clipped = pbt_exploit_explore(SCORES, {"lr": LR}, np.random.default_rng(seed),
                                     perturb=(0.01, 100.0), bounds=space)
    assert clipped["lr"][0] in (0.01, 0.08) and clipped["lr"][5] in (0.01, 0.08)


def test_exploit_sources_random_and_paired():
  # Best: 1 (0.9), 4 (0.8); worst: 0 (0.1), 5 (0.2).
  paired = exploit_sources(SCORES, 0.25)
  np.testing.assert_array_equal(paired, [1, 1, 2, 3, 4, 4, 6, 7])  # worst <- best, 2nd <- 2nd
  for seed in range(5):
    source = exploit_sources(SCORES, 0.25, np.random.default_rng(seed))
    assert set(source[[0, 5]]) <= {1, 4} and np.all(source[[1, 2, 3, 4, 6, 7]] == [1, 2, 3, 4, 6, 7])
    same, _ = pbt_exploit_explore(SCORES, {}, np.random.default_rng(seed))
    np.testing.assert_array_equal(source, same)  # one exploit: PBT's explore only adds to it
  # PBA's case: the i-th worst copies the i-th best (ties by index); two members: one copies.
  scores = [0.5, 0.9, 0.1, 0.7, 0.3, 0.8, 0.2, 0.6]
  np.testing.assert_array_equal(exploit_sources(scores, 0.25), [0, 1, 1, 3, 4, 5, 5, 7])
  np.testing.assert_array_equal(exploit_sources([1.0, 0.0], 0.25), [0, 0])
  np.testing.assert_array_equal(exploit_sources([1.0, np.nan, 0.0], 0.5), [0, 0, 2])
  np.testing.assert_array_equal(exploit_sources([3.0], 0.5), [0])
  with pytest.raises(ValueError, match="quantile"):
    exploit_sources(SCORES, 0.0)


def test_gather_members_copies_every_leaf_along_the_trial_axis():
  tree = {"w": jnp.arange(4.0)[:, None] * jnp.ones((4, 3)), "s": (np.arange(4),)}
  out = gather_members(tree, np.array([0, 0, 3, 2]))
  np.testing.assert_array_equal(out["s"][0], [0, 0, 3, 2])
  np.testing.assert_array_equal(out["w"], np.array([0.0, 0.0, 3.0, 2.0])[:, None] * np.ones(3))


def test_bad_inputs():
  rng = np.random.default_rng(0)
  with pytest.raises(ValueError, match="quantile"):
    pbt_exploit_explore(SCORES, {}, rng, quantile=0.75)
  with pytest.raises(ValueError, match=r"hparams\['lr'\] has shape \(3,\)"):
    pbt_exploit_explore(SCORES, {"lr": np.zeros(3)}, rng)


@pytest.mark.parametrize("fields, field", [
    (dict(population_size=1), "population_size"),
    (dict(population_size=0), "population_size"),
    (dict(population_size=4.0), "population_size"),
    (dict(population_size=True), "population_size"),
    (dict(pbt_interval=0), "pbt_interval"),
    (dict(pbt_interval=-1.0), "pbt_interval"),
    (dict(quantile=0.0), "quantile"),
    (dict(quantile=0.6), "quantile"),
])
def test_pbt_spec_errors_name_the_field(fields, field):
  with pytest.raises(ValueError, match=rf"^PBT\.{field}: "):
    PBT(**fields)


def test_pbt_spec_accepts_the_edges():
  spec = PBT(population_size=2, pbt_interval=0.5, quantile=0.5)
  assert (spec.population_size, spec.pbt_interval, spec.quantile) == (2, 0.5, 0.5)
  assert PBT.name == "pbt" and PBT.population_based and not PBT.multi_fidelity


def test_pbt_rounds():
  assert PBT(pbt_interval=2).rounds(10) == 5
  assert PBT(pbt_interval=10).rounds(10) == 1
  assert PBT(pbt_interval=0.1).rounds(1.0) == 10  # 1.0 / 0.1 is 10.000000000000002
  assert isinstance(PBT(pbt_interval=2).rounds(10.0), int)
  with pytest.raises(ValueError, match=r"PBT\.pbt_interval: 3 must divide the max budget \(10\)"):
    PBT(pbt_interval=3).rounds(10)
  with pytest.raises(ValueError, match="pbt_interval"):
    PBT(pbt_interval=20).rounds(10)  # not even one round


def test_pbt_round_trips_through_algorithm_from_dict():
  spec = PBT(population_size=8, pbt_interval=2.5, quantile=0.125, seed=7)
  data = json.loads(json.dumps(spec.to_dict()))
  assert data == {"name": "pbt", "population_size": 8, "pbt_interval": 2.5, "quantile": 0.125,
                  "seed": 7}
  assert algorithm_from_dict(data) == spec
  assert algorithm_from_dict({"name": "pbt"}) == PBT()


def test_pbt_asks_distinct_valid_random_configs_for_a_seed(model_space):
  def population(seed, n=8):
    return PBT(population_size=n, seed=seed).build(model_space, Objective("auc")).ask(n)

  members = population(seed=3)
  assert [s.trial_id for s in members] == list(range(8))
  assert len({s.config for s in members}) == 8
  for s in members:
    model_space.validate(s.config)
    assert (s.budget, s.rung, s.parent_trial_id, s.resume_from) == (None, None, None, None)
  assert population(seed=3) == members
  assert [s.config for s in population(seed=4)] != [s.config for s in members]
