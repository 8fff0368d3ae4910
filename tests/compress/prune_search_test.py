"""ctr_compress: data, genomes, the vmapped fine-tune (== a lone fine-tune + physical prune),
evolution keeping a front, choose."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sfjax.automl import pareto, pareto_evolution
from sfjax.compress import prune as ctr_prune
from sfjax.compress import prune_search as ctr_compress
from sfjax.core import metrics as metrics_lib
from sfjax.data import dataset as dataset_lib
from sfjax.embedding import device_table, row_optimizers
from sfjax.models import registry
from sfjax.train import optimizers
from sfjax.train import step as step_lib
from sfjax.train.defaults import ctr_defaults
from sfjax.train.state import TrainState

STEPS, BATCH, LR = 4, 64, 3e-3


@functools.cache
def _setup():
  data_cfg = ctr_defaults().data
  s = data_cfg.synthetic
  s.num_train, s.num_eval, s.test_rows, s.cardinality_scale = 2000, 600, 500, 0.0001
  dataset = dataset_lib.make_dataset(data_cfg, 0)
  cfg = {"name": "deepfm", "embed_dim": 4, "mlp_dims": (8, 6)}
  spec = ctr_prune.make_spec(cfg, dataset.spec.num_fields, dataset.spec.num_dense, (1, 2, 4),
                             (4, 32))
  graphdef, state = nnx.split(nnx.eval_shape(lambda: registry.build_model_from_config(
      cfg, num_fields=spec.num_fields, num_dense=spec.num_dense, rngs=nnx.Rngs(0))))
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda a: rng.normal(0, 0.2, a.shape).astype(np.float32),
                        nnx.to_pure_dict(state))
  values = rng.normal(0, 0.1, (dataset.spec.total_rows, spec.width)).astype(np.float32)
  data = ctr_compress.load_data(dataset, STEPS, BATCH, seed=0, valid_rows=400,
                                eval_batch_size=256)
  evaluate = ctr_compress._make_evaluator(graphdef, spec, params, values, data, LR,
                                          eval_chunk=256)
  return dataset, spec, graphdef, params, values, data, evaluate


def test_load_data_shapes_and_global_ids():
  dataset, spec, *_, data, _ = _setup()
  assert data.train.ids.shape == (STEPS, BATCH, spec.num_fields)
  assert data.train.dense.shape == (STEPS, BATCH, spec.num_dense)
  assert data.valid.ids.shape == (400, spec.num_fields) and data.test.labels.shape == (500,)
  offsets = dataset.spec.field_offsets
  for ids in (data.train.ids.reshape(-1, spec.num_fields), data.test.ids):
    assert np.all(ids >= offsets) and np.all(ids < offsets + np.asarray(dataset.spec.field_rows))
  with pytest.raises(ValueError, match="data: no eval split 'nosuch'"):
    ctr_compress.load_data(dataset, 1, 8, 0, valid_split="nosuch")


def test_the_first_genomes_probe_each_axis_in_turn():
  spec = _setup()[1]
  full = ctr_prune.full_genome(spec)
  genomes = ctr_compress._random_genomes(np.random.default_rng(0), spec, 7)
  units = slice(0, -2)
  np.testing.assert_array_equal(genomes[0], full)  # the unpruned model first
  for i in (1, 4):  # mixed: units and (k, bits) both drawn
    assert not genomes[i][units].all() and tuple(genomes[i][-2:]) != tuple(full[-2:]), i
  for i in (2, 5):  # table only: every unit kept, (k, bits) drawn
    assert genomes[i][units].all() and tuple(genomes[i][-2:]) != tuple(full[-2:]), i
  for i in (3, 6):  # MLP only: units drawn, k = D at the widest bits
    assert not genomes[i][units].all() and tuple(genomes[i][-2:]) == tuple(full[-2:]), i


def test_random_and_mutated_genomes_are_valid():
  spec = _setup()[1]
  rng = np.random.default_rng(3)
  genomes = ctr_compress._random_genomes(rng, spec, 6)
  np.testing.assert_array_equal(genomes[0], ctr_prune.full_genome(spec))
  children = [ctr_compress._mutate(rng, spec, g, 0.5) for g in genomes]
  for g in list(genomes) + children:
    ctr_prune.check_genome(spec, g)  # 0/1 bits, no empty layer, k a choice
  np.testing.assert_array_equal(ctr_compress._mutate(rng, spec, genomes[2], 0.0), genomes[2])
  assert len({tuple(c) for c in children}) > 1


def test_finetune_batches_index_the_touched_rows():
  _, spec, *_, data, _ = _setup()
  batches = ctr_compress.finetune_batches(data.train)
  np.testing.assert_array_equal(batches.rows, np.unique(data.train.ids))
  b = batches.batches
  assert b.rows.shape == (STEPS, BATCH * spec.num_fields) and b.vids.shape == data.train.ids.shape
  for s in range(STEPS):  # compact row -> global id reproduces every id of every step
    np.testing.assert_array_equal(batches.rows[b.rows[s][b.vids[s]]], data.train.ids[s])
    assert np.all(b.rows[s][len(np.unique(data.train.ids[s])):] == batches.rows.size)  # padding
  ids = np.array([[batches.rows[0], batches.rows[-1], batches.rows[-1] + 1]])
  np.testing.assert_array_equal(ctr_compress._compact_ids(batches.rows, ids),
                                [[0, batches.rows.size - 1, batches.rows.size]])  # untouched: T
  one = np.array([5])
  np.testing.assert_array_equal(ctr_compress._compact_ids(one, np.array([[5, 7, 2]])), [[0, 1, 1]])
  none = ctr_compress._compact_ids(np.array([], np.int64), np.array([[3, 4]]))
  np.testing.assert_array_equal(none, [[0, 0]])  # an empty table: every id misses (row T = 0)
  assert none.dtype == np.int32


@pytest.mark.slow  # the fast tier stays under 5 minutes; make test-all runs it
def test_vmapped_finetune_equals_a_lone_finetune_then_physical_prune():
  _, spec, graphdef, params, values, data, evaluate = _setup()
  g1 = ctr_prune.full_genome(spec)
  g1[[0, 2, 9]] = 0
  g1[-2:] = (2, 4)  # k = 2 of 4 latent dims, 4-bit rows
  genomes = np.stack([ctr_prune.full_genome(spec), g1, g1])
  valid, test = evaluate(genomes)
  assert valid[1] == valid[2] and test[1] == test[2]  # same genome, same batches: same result
  batches = ctr_compress.finetune_batches(data.train)
  tune = jax.jit(lambda g, table: ctr_compress.finetune(graphdef, spec, params, values, g,
                                                        batches, LR, tune_table=table),
                 static_argnums=1)
  tuned, rows = tune(g1, True)
  table = ctr_compress.with_tuned_rows(values, batches, rows)
  pruned = ctr_prune.prune(spec, jax.tree.map(np.asarray, tuned), table, g1)
  assert pruned.values.shape == (values.shape[0], 3) and pruned.bits == 4
  logits = ctr_compress.score(pruned.graphdef, pruned.params, pruned.values, data.valid, 256)
  assert abs(metrics_lib.auc(data.valid.labels, logits) - valid[1]) < 1e-4
  # The fine-tune moved the touched rows (tune_table defaults to True), only those.
  assert not np.allclose(np.asarray(rows), values[batches.rows])
  untouched = np.setdiff1d(np.arange(values.shape[0]), batches.rows)
  np.testing.assert_array_equal(table[untouched], values[untouched])
  frozen, frozen_rows = tune(g1, False)
  np.testing.assert_array_equal(np.asarray(frozen_rows), values[batches.rows])
  assert not np.allclose(np.asarray(frozen["mlp"]["out"]["kernel"]),
                         params["mlp"]["out"]["kernel"])
  # The dropped units' weights are 0 and stayed there (the step's dense_mask).
  np.testing.assert_array_equal(np.asarray(frozen["mlp"]["hidden"][0]["kernel"])[:, [0, 2]], 0.0)


def test_evolution_keeps_and_improves_the_front():
  _, spec, _, _, values, _, evaluate = _setup()

  def size_of(g):
    return (ctr_prune.pruned_size(spec, values.shape[0], g),
            ctr_prune.pruned_bits(spec, values.shape[0], g))

  def mutate(r, g):
    return ctr_compress._mutate(r, spec, g, 0.2)

  population = ctr_compress._random_genomes(np.random.default_rng(0), spec, 3)

  def evolve(generations):
    return pareto_evolution.evolve(
        population, evaluate, lambda g: size_of(g)[1], mutate, generations,
        np.random.default_rng(1), size_of=lambda g: size_of(g)[0])

  first, more = evolve(0), evolve(2)
  assert set(first) <= set(more) and len(more) > len(first)  # an archive: nothing is lost
  assert all((c.size, c.cost) == size_of(np.asarray(c.genome)) for c in more)
  assert {c.genome[-1] for c in more} == {4, 32}  # quantized and float tables both tried
  front = pareto_evolution.candidate_front(more)
  assert [c.cost for c in front] == sorted(c.cost for c in front)

  def points(cs):
    return [[c.valid, c.cost] for c in cs]

  dirs, ref = ("maximize", "minimize"), (0.0, size_of(ctr_prune.full_genome(spec))[1] + 1)

  def dominates(o, c):
    return (o.valid >= c.valid and o.cost <= c.cost
            and (o.valid > c.valid or o.cost < c.cost))

  assert not any(dominates(o, c) for c in front for o in more)  # nothing beats a front point
  assert all(any(dominates(c, o) for c in front) for o in set(more) - set(front))
  assert (pareto.hypervolume_2d(points(front), dirs, ref)
          >= pareto.hypervolume_2d(points(pareto_evolution.candidate_front(first)), dirs, ref))
  ranked = pareto_evolution.ranked_candidates(more)
  assert set(ranked[:len(front)]) == set(front)
  assert evaluate.traces == 1  # every generation of P = 3 ran the same compiled program


LIVE = ((0, 2, 4, 6), (1, 3, 5))  # the planted model's live units per hidden layer


@functools.cache
def _planted():
  """A wide_deep whose logit is its MLP, with only the `LIVE` units alive (the others' input
  weights and biases are 0: pruning them changes nothing), and data labelled by it (the
  logit above its median is a click). MLP-only genomes (k = D, float rows)."""
  num_fields, num_dense, rows_per_field = 4, 2, 30
  cfg = {"name": "wide_deep", "embed_dim": 4, "mlp_dims": (8, 6)}
  spec = ctr_prune.make_spec(cfg, num_fields, num_dense, (4,), (32,))
  graphdef, state = nnx.split(nnx.eval_shape(lambda: registry.build_model_from_config(
      cfg, num_fields=num_fields, num_dense=num_dense, rngs=nnx.Rngs(0))))
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda a: rng.normal(0, 1.0, a.shape).astype(np.float32),
                        nnx.to_pure_dict(state))
  params["dense_linear"]["kernel"][:] = 0
  for layer, live in enumerate(LIVE):
    hidden = params["mlp"]["hidden"][layer]
    dead = np.setdiff1d(np.arange(hidden["bias"].shape[0]), live)
    hidden["kernel"][:, dead], hidden["bias"][dead], hidden["bias"][list(live)] = 0.0, 0.0, 1.0
    after = params["mlp"]["hidden"][1] if layer == 0 else params["mlp"]["out"]
    after["kernel"][list(live)] += 2.0 * np.sign(after["kernel"][list(live)])
  values = rng.normal(0, 1.0, (num_fields * rows_per_field, spec.width)).astype(np.float32)
  values[:, -1] = 0.0  # no first-order weights: the logit is the MLP's

  def examples(n, seed):
    r = np.random.default_rng(seed)
    ids = (r.integers(0, rows_per_field, (n, num_fields))
           + rows_per_field * np.arange(num_fields)).astype(np.int32)
    dense = r.normal(size=(n, num_dense)).astype(np.float32)
    logit = np.asarray(ctr_prune.logits(graphdef, params, values, ids, dense))
    return ctr_compress.Examples(ids, dense, (logit > np.median(logit)).astype(np.float32))

  train = examples(4 * 64, 1)
  data = ctr_compress.CompressData(
      ctr_compress.Examples(*(a.reshape(4, 64, *a.shape[1:]) for a in train)),
      examples(400, 2), examples(400, 3))
  evaluate = ctr_compress._make_evaluator(graphdef, spec, params, values, data, LR,
                                          eval_chunk=200)
  return spec, values.shape[0], evaluate


def _same_sizes(rng, spec, genome):
  """A random genome keeping as many units of each layer as `genome` (so the same bits)."""
  out, start = np.array(genome), 0
  for width in spec.hidden:
    kept = int(out[start:start + width].sum())
    out[start:start + width] = 0
    out[start + rng.choice(width, kept, replace=False)] = 1
    start += width
  return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_front_dominates_the_unpruned_model_and_random_masks_of_its_sizes(seed):
  # Measured (seeds 0-7): the unpruned model scores 0.9996 valid AUC; the front always holds a
  # point of fewer bits scoring as much (only dead units dropped), and random masks of that
  # point's sizes score 0.48-0.80 unless they happen to keep every live unit.
  spec, num_rows, evaluate = _planted()

  def bits(g):
    return ctr_prune.pruned_bits(spec, num_rows, g)

  rng = np.random.default_rng(seed)
  found = pareto_evolution.evolve(ctr_compress._random_genomes(rng, spec, 4), evaluate, bits,
                                  lambda r, g: ctr_compress._mutate(r, spec, g, 0.15), 4, rng)
  front = pareto_evolution.candidate_front(found)
  full = next(c for c in found if c.genome == tuple(ctr_prune.full_genome(spec)))
  best = [c for c in front if c.valid >= full.valid and c.cost < full.cost]
  assert best, [(c.cost, c.valid) for c in front]  # the unpruned model is dominated
  twins = np.stack([_same_sizes(rng, spec, best[0].genome) for _ in range(4)])
  valid, _ = evaluate(twins)
  assert all(bits(t) == best[0].cost for t in twins)
  assert np.all(best[0].valid >= valid), (best[0].valid, valid)  # no random mask beats it
  kept_live = [all(t[layer * 8 + u] for layer, units in enumerate(LIVE) for u in units)
               for t in twins]
  assert np.all((valid < best[0].valid) | np.asarray(kept_live))  # only the live-keeping tie


def test_choose_by_hand():
  def c(bits, auc):
    return pareto_evolution.Candidate((bits,), bits, auc, auc, bits // 32)

  front = [c(10, 0.70), c(20, 0.75), c(30, 0.78)]
  assert pareto_evolution.choose(front, 0.78, 0.03).cost == 20
  assert pareto_evolution.choose(front, 0.78, 0.10).cost == 10
  assert pareto_evolution.choose(front, 0.90, 0.01).cost == 30  # none within: the most accurate


def test_score_a_model_without_dense_features_in_padded_chunks():
  # A model with no dense features has dense [N, 0]: scoring it used to fail (a reshape of a
  # zero-size array cannot infer its chunk count). Chunked logits equal one whole call.
  num_fields, rows_per_field, n = 3, 20, 37
  cfg = {"name": "deepfm", "embed_dim": 4, "mlp_dims": (8,)}
  model = registry.build_model_from_config(cfg, num_fields=num_fields, num_dense=0,
                                           rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  params = nnx.to_pure_dict(state)
  width = ctr_prune.make_spec(cfg, num_fields, 0, (4,), (32,)).width
  rng = np.random.default_rng(0)
  values = rng.normal(0, 0.5, (num_fields * rows_per_field, width)).astype(np.float32)
  ids = (rng.integers(0, rows_per_field, (n, num_fields))
         + rows_per_field * np.arange(num_fields)).astype(np.int32)
  rows = ctr_compress.Examples(ids, np.zeros((n, 0), np.float32), np.zeros(n, np.float32))
  got = ctr_compress.score(graphdef, params, values, rows, chunk=8)
  want = np.asarray(ctr_prune.logits(graphdef, params, values, ids, rows.dense))
  assert got.shape == (n,) and np.std(want) > 0
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_search_and_score_compile_with_the_given_options():
  _, spec, graphdef, params, values, data, evaluate = _setup()
  eigen = {"xla_cpu_experimental_ynn_fusion_type": ""}
  with_eigen = ctr_compress._make_evaluator(graphdef, spec, params, values, data, LR,
                                            eval_chunk=256, compiler_options=eigen)
  genomes = np.stack([ctr_prune.full_genome(spec)] * 2)
  text = with_eigen._run.lower(genomes, *with_eigen._args).compile().as_text()
  assert "dot(" in text and "__ynn_fusion" not in text  # Eigen: XLA's own dot thunks
  for a, b in zip(with_eigen(genomes), evaluate(genomes), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-4)  # float rounding only
  logits = ctr_compress.score(graphdef, params, values, data.valid, 256, compiler_options=eigen)
  np.testing.assert_allclose(logits, ctr_compress.score(graphdef, params, values, data.valid,
                                                        256), rtol=1e-5, atol=1e-6)


class _Stop(Exception):
  """Ends a run at a patched call (what it was called with is all the check needs): the
  search at its evaluator here, the compress step at its search (compress_step_test)."""


def test_search_evolves_its_random_genomes_over_the_vmapped_finetune(monkeypatch):
  _, spec, graphdef, params, values, data, evaluate = _setup()
  settings = {"population": 3, "generations": 1, "learning_rate": LR, "mutation_rate": 0.3,
              "seed": 4}
  found = ctr_compress.search(graphdef, spec, params, values, data, **settings)
  rng = np.random.default_rng(4)
  num_rows = values.shape[0]
  expected = pareto_evolution.evolve(
      ctr_compress._random_genomes(rng, spec, 3), evaluate,
      lambda g: ctr_prune.pruned_bits(spec, num_rows, g),
      lambda r, g: ctr_compress._mutate(r, spec, g, 0.3), 1, rng,
      size_of=lambda g: ctr_prune.pruned_size(spec, num_rows, g))
  assert [(c.genome, c.cost, c.size) for c in found] == [
      (c.genome, c.cost, c.size) for c in expected]
  assert len(found) > 3  # the generation after the first evaluated new genomes
  for got, want in zip(found, expected, strict=True):  # the same fine-tune (tuned rows too)
    assert abs(got.valid - want.valid) < 1e-6 and abs(got.test - want.test) < 1e-6
  seen = []

  def make_evaluator(*args, **kwargs):
    seen.append((args[6:], kwargs))
    raise _Stop  # the search stops at its evaluator

  monkeypatch.setattr(ctr_compress, "_make_evaluator", make_evaluator)
  options = {"xla_cpu_experimental_ynn_fusion_type": ""}
  with pytest.raises(_Stop):
    ctr_compress.search(graphdef, spec, params, values, data, **settings, tune_table=False,
                        compiler_options=options)
  assert seen == [((False,), {"compiler_options": options})]


@pytest.mark.slow  # ~7 s (three evaluators compiled); the fast tier stays under 5 minutes
def test_the_evaluator_tunes_the_touched_rows_by_default_and_counts_its_traces():
  _, spec, graphdef, params, values, data, _ = _setup()
  genomes = np.stack([ctr_prune.full_genome(spec)] * 2)

  def logits(**kwargs):
    evaluate = ctr_compress._make_evaluator(graphdef, spec, params, values, data, 0.3,
                                            eval_chunk=256, **kwargs)
    out = [np.asarray(a) for a in evaluate._run(genomes, *evaluate._args)]
    return out, evaluate

  (default, _), (tuned, _), (frozen, evaluate) = (
      logits(), logits(tune_table=True), logits(tune_table=False))
  for a, b, c in zip(default, tuned, frozen, strict=True):
    np.testing.assert_array_equal(a, b)
    assert np.abs(a - c).max() > 1e-4  # tuned rows score otherwise
  assert evaluate.traces == 1
  evaluate(genomes)
  evaluate(genomes[::-1])
  assert evaluate.traces == 1  # the same P: no retrace
  evaluate(genomes[:1])
  assert evaluate.traces == 2  # one more trace for P = 1
  batches = ctr_compress.finetune_batches(data.train)
  _, rows = jax.jit(lambda g: ctr_compress.finetune(graphdef, spec, params, values, g, batches,
                                                    0.3))(genomes[0])
  assert not np.allclose(np.asarray(rows), values[batches.rows])  # tune_table defaults to True


def test_finetune_on_the_touched_rows_equals_the_step_on_the_whole_table():
  # The reference trains the whole [V, E] table (slots [V, S]) with global row ids: the
  # compact table, its slots and the compacted batches must give the same rows and params.
  _, spec, graphdef, params, values, data, _ = _setup()
  batches = ctr_compress.finetune_batches(data.train)
  genome = ctr_prune.full_genome(spec)
  genome[[1, 4]] = 0
  tuned, rows = jax.jit(lambda g: ctr_compress.finetune(graphdef, spec, params, values, g,
                                                        batches, 0.05))(genome)
  num_touched, num_rows = batches.rows.size, values.shape[0]
  b = batches.batches
  global_rows = np.where(b.rows < num_touched, batches.rows[np.minimum(b.rows, num_touched - 1)],
                         num_rows).astype(np.int32)  # padding: V (out of the table)
  graph, state = nnx.split(ctr_prune.masked_model(graphdef, spec, params, genome))
  keep = ctr_prune.masked_model(graphdef, spec, jax.tree.map(np.ones_like, params), genome)
  tx = optimizers.dense_optimizer("adam", 0.05)
  row_opt = row_optimizers.adam(0.05)
  slots = np.tile(np.asarray(row_opt.initial_slot_row(values.shape[1])), (num_rows, 1))
  start = TrainState(jnp.zeros((), jnp.int32), state, tx.init(nnx.state(state, nnx.Param)),
                     device_table.TableState(jnp.asarray(values), jnp.asarray(slots)))
  step = step_lib.make_train_step(graph, tx, row_opt, dense_mask=nnx.state(keep, nnx.Param),
                                  model_variables=True)
  end, _ = jax.jit(lambda s, bs: jax.lax.scan(step, s, bs))(
      start, jax.tree.map(jnp.asarray, b._replace(rows=global_rows)))
  table = np.asarray(end.table.values)
  np.testing.assert_allclose(np.asarray(rows), table[batches.rows], rtol=1e-5, atol=1e-6)
  untouched = np.setdiff1d(np.arange(num_rows), batches.rows)
  np.testing.assert_array_equal(table[untouched], values[untouched])
  assert not np.allclose(np.asarray(rows), values[batches.rows])  # the rows did move
  jax.tree.map(lambda a, r: np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-6), tuned,
               nnx.to_pure_dict(end.params)["model"])
