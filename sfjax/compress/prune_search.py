"""Compression search on a trained CTR model: Prune-EA / Quant-EA over MLP neurons,
embedding dims and table bits.

VEGA's Prune-EA / Quant-EA (arXiv 2011.01507) on a CTR model: an evolutionary,
multi-objective search (held-out AUC up, exact stored bits down: 32 x the parameter
count when nothing is quantized) over `ctr_prune` genomes (keep-bits over the MLP
tower's hidden units, the kept latent dim k of every field, the table's bits b).
Each candidate is fine-tuned briefly from the trained weights and scored
on the valid rows; the test rows are scored too, only to be reported.

Each generation is ONE compiled program: `jax.vmap` over genomes of a `lax.scan`
of Adam steps on the masked model (masks are traced arrays of one padded shape,
so no candidate compiles its own program). The trained params and table are
shared inputs; with `tune_table` every candidate tunes its own copy of the
table ([P, V, E] in memory: for large tables tune only the dense params).
The loop is `sfjax.automl.pareto_evolution.evolve` (parents: the best of
everything evaluated so far by (Pareto rank, valid AUC), NSGA-II's elitism
without crowding; children their mutations); `search` returns every evaluated
candidate, whose front and pick `pareto_evolution.pareto_front` / `choose` give.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sfjax.automl import pareto_evolution
from sfjax.compress import prune as ctr_prune
from sfjax.core import metrics as metrics_lib
from sfjax.embedding import vsi
from sfjax.train import step as step_lib


class Examples(NamedTuple):
  """Host arrays of labelled rows (global table row ids).

  Attributes:
    ids: [..., F] int32 global row ids (field offsets added).
    dense: [..., Nd] float32.
    labels: [...] float32 in {0, 1}.
  """

  ids: np.ndarray
  dense: np.ndarray
  labels: np.ndarray


class CompressData(NamedTuple):
  """What the search reads.

  Attributes:
    train: [S, B, ...] the fine-tune batches (every candidate sees the same ones).
    valid: [N, ...] the rows candidates are selected on.
    test: [M, ...] the rows only reported.
  """

  train: Examples
  valid: Examples
  test: Examples


def _real_rows(batches, field_offsets, limit: int | None) -> Examples:
  ids, dense, labels, n = [], [], [], 0
  for b in batches:
    keep = np.asarray(b.mask) > 0
    ids.append(vsi.global_row_ids(b.ids[keep], field_offsets).astype(np.int32))
    dense.append(np.asarray(b.dense, np.float32)[keep])
    labels.append(np.asarray(b.labels, np.float32)[keep])
    n += int(keep.sum())
    if limit is not None and n >= limit:
      break
  out = Examples(np.concatenate(ids), np.concatenate(dense), np.concatenate(labels))
  return out if limit is None else Examples(*(a[:limit] for a in out))


def load_data(dataset, steps: int, batch_size: int, seed: int, valid_split: str = "eval",
              test_split: str = "test", valid_rows: int | None = None,
              eval_batch_size: int = 4096) -> CompressData:
  """The fine-tune batches and the valid / test rows of a `CTRDataset`.

  Args:
    dataset: `sfjax.data.dataset.make_dataset`'s data set.
    steps, batch_size: S fine-tune batches of B rows (`train_batches(B, seed)`).
    seed: the batch order's seed.
    valid_split, test_split: eval split names (selection / report).
    valid_rows: the first rows of `valid_split` to select on (None: all).
    eval_batch_size: rows per read of the eval splits.

  Raises:
    ValueError: naming the split when the data set lacks it.
  """
  for split in (valid_split, test_split):
    if split not in dataset.eval_splits:
      raise ValueError(f"data: no eval split {split!r} (eval splits: {dataset.eval_splits})")
  offsets = dataset.spec.field_offsets
  stream = dataset.train_batches(batch_size, seed)
  train = [next(stream) for _ in range(steps)]
  stacked = Examples(
      np.stack([vsi.global_row_ids(b.ids, offsets).astype(np.int32) for b in train]),
      np.stack([np.asarray(b.dense, np.float32) for b in train]),
      np.stack([np.asarray(b.labels, np.float32) for b in train]))
  return CompressData(stacked,
                      _real_rows(dataset.eval_batches(valid_split, eval_batch_size), offsets,
                                 valid_rows),
                      _real_rows(dataset.eval_batches(test_split, eval_batch_size), offsets, None))


def chunked_logits(fn: Callable, rows: Examples, chunk: int) -> jax.Array:
  """`fn(ids, dense) -> [c]` over `rows` in chunks of `chunk` (padded), as [N] (traceable)."""
  n = rows.labels.shape[0]
  pad = -n % chunk
  ids = jnp.pad(jnp.asarray(rows.ids), ((0, pad), (0, 0))).reshape(-1, chunk, rows.ids.shape[1])
  dense = jnp.pad(jnp.asarray(rows.dense), ((0, pad), (0, 0))).reshape(-1, chunk,
                                                                        rows.dense.shape[1])
  return jax.lax.map(lambda xs: fn(*xs), (ids, dense)).reshape(-1)[:n]


def finetune(graphdef, spec: ctr_prune.PruneSpec, params: dict, values: jax.Array, genome,
             train: Examples, learning_rate, tune_table: bool = True):
  """Adam steps over `train` [S, B, ...] on the genome's masked model (traceable genome).

  Returns:
    (params, values): tuned (`values` unchanged unless `tune_table`).
  """
  tx = optax.adam(learning_rate)

  def loss(trainable, batch):
    p, v = trainable if tune_table else (trainable, values)
    ids, dense, labels = batch
    out = ctr_prune.masked_logits(graphdef, spec, p, v, genome, ids, dense)
    return step_lib.masked_loss(out, labels, jnp.ones_like(labels))

  def step(carry, batch):
    trainable, opt_state = carry
    updates, opt_state = tx.update(jax.grad(loss)(trainable, batch), opt_state, trainable)
    return (optax.apply_updates(trainable, updates), opt_state), None

  trainable = (params, values) if tune_table else params
  (trainable, _), _ = jax.lax.scan(step, (trainable, tx.init(trainable)),
                                   tuple(jnp.asarray(a) for a in train))
  return trainable if tune_table else (trainable, values)


def make_evaluator(graphdef, spec: ctr_prune.PruneSpec, params: dict, values,
                   data: CompressData, learning_rate: float, tune_table: bool = True,
                   eval_chunk: int = 4096) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
  """`evaluate(genomes [P, G]) -> (valid_auc [P], test_auc [P])`: a vmapped fine-tune.

  Every genome starts from `params` / `values` and takes the same Adam steps over
  `data.train` on its masked model (`finetune`), so candidates differ only by
  their genome. One compiled program serves every population of the same P;
  `evaluate.traces` counts the traces (1 per population size).
  """
  def one(genome, params, values, train, valid, test):
    evaluate.traces += 1  # Python runs here only while tracing
    p, v = finetune(graphdef, spec, params, values, genome, train, learning_rate, tune_table)
    score = lambda ids, dense: ctr_prune.masked_logits(graphdef, spec, p, v, genome, ids, dense)
    return chunked_logits(score, valid, eval_chunk), chunked_logits(score, test, eval_chunk)

  run = jax.jit(jax.vmap(one, in_axes=(0, None, None, None, None, None)))

  def evaluate(genomes):
    valid_logits, test_logits = jax.device_get(run(jnp.asarray(genomes, jnp.int32), params,
                                                   values, data.train, data.valid, data.test))
    valid = [metrics_lib.auc(data.valid.labels, s) for s in valid_logits]
    test = [metrics_lib.auc(data.test.labels, s) for s in test_logits]
    return np.asarray(valid), np.asarray(test)

  evaluate.traces = 0
  return evaluate


def _fix_empty_layers(spec: ctr_prune.PruneSpec, genome: np.ndarray, rng) -> np.ndarray:
  start = 0
  for width in spec.hidden:
    if not genome[start:start + width].any():
      genome[start + rng.integers(width)] = 1
    start += width
  return genome


def random_genomes(rng: np.random.Generator, spec: ctr_prune.PruneSpec, n: int) -> np.ndarray:
  """[n, G] genomes probing each axis alone and together.

  Row 0 is the unpruned model (it anchors the front); then, in turn, a mixed
  genome (each layer keeps a random share in [0.25, 1], random k and b), a
  table-only one (every unit kept, random k and b) and an MLP-only one (random
  shares, k = D, the widest bits), so the first generation measures each axis.
  """
  out = np.tile(ctr_prune.full_genome(spec), (n, 1))
  for i in range(1, n):
    kind = (i - 1) % 3
    if kind != 1:  # mixed or MLP-only: random unit shares
      start = 0
      for width in spec.hidden:
        share = rng.uniform(0.25, 1.0)
        keep = rng.choice(width, size=max(1, int(round(width * share))), replace=False)
        out[i, start:start + width] = 0
        out[i, start + keep] = 1
        start += width
    if kind != 2:  # mixed or table-only: random k and bits
      out[i, -2] = rng.choice(spec.dim_choices)
      out[i, -1] = rng.choice(spec.bit_choices)
  return out


def mutate(rng: np.random.Generator, spec: ctr_prune.PruneSpec, genome: np.ndarray,
           rate: float) -> np.ndarray:
  """Flips each unit bit with probability `rate` and moves k and b each one choice up
  or down with probability `rate`; a layer never loses all its units."""
  genome = np.array(genome, np.int32)
  units = genome[:-2]
  flips = rng.random(units.shape) < rate
  genome[:-2] = np.where(flips, 1 - units, units)
  for gene, choices in ((-2, spec.dim_choices), (-1, spec.bit_choices)):
    if rng.random() < rate:
      index = choices.index(int(genome[gene])) + int(rng.choice([-1, 1]))
      genome[gene] = choices[int(np.clip(index, 0, len(choices) - 1))]
  return _fix_empty_layers(spec, genome, rng)


def search(graphdef, spec: ctr_prune.PruneSpec, params: dict, values, data: CompressData, *,
           population: int, generations: int, learning_rate: float, mutation_rate: float,
           seed: int, tune_table: bool = True) -> list[pareto_evolution.Candidate]:
  """Prune-EA / Quant-EA on a trained model (already `ctr_prune.order_columns`-ed):
  every candidate (`pareto_evolution.evolve`'s: cost = exact stored bits
  (`ctr_prune.pruned_bits`), size = exact parameters (`ctr_prune.pruned_size`),
  valid / test = AUC after its fine-tune).

  Args:
    graphdef, spec, params, values: the trained model and its `PruneSpec`.
    data: fine-tune batches, valid and test rows.
    population, generations: P genomes per generation; generations after the first.
    learning_rate: Adam's, for every candidate's fine-tune.
    mutation_rate: per-gene mutation probability.
    seed: of the initial population and the mutations.
    tune_table: fine-tune the embedding table too (a copy per candidate).
  """
  rng = np.random.default_rng(seed)
  evaluate = make_evaluator(graphdef, spec, params, values, data, learning_rate, tune_table)
  num_rows = int(values.shape[0])
  return pareto_evolution.evolve(
      random_genomes(rng, spec, population), evaluate,
      lambda g: ctr_prune.pruned_bits(spec, num_rows, g),
      lambda r, g: mutate(r, spec, g, mutation_rate), generations, rng,
      size_of=lambda g: ctr_prune.pruned_size(spec, num_rows, g))


def score(graphdef, params: dict, values, rows: Examples, chunk: int = 4096) -> np.ndarray:
  """[N] logits of a plain (unmasked or physically pruned) model on `rows`."""
  fn = jax.jit(lambda p, v, r: chunked_logits(
      lambda ids, dense: ctr_prune.logits(graphdef, p, v, ids, dense), r, chunk))
  return np.asarray(fn(params, values, rows))
