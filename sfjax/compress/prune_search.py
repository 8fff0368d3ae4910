"""Compression search on a trained CTR model: Prune-EA / Quant-EA over MLP neurons,
embedding dims and table bits.

VEGA's Prune-EA / Quant-EA (arXiv 2011.01507) on a CTR model: an evolutionary,
multi-objective search (held-out AUC up, exact stored bits down: 32 x the parameter
count when nothing is quantized) over `prune` genomes (keep-bits over the MLP
tower's hidden units, the kept latent dim k of every field, the table's bits b;
drawn and mutated by `sfjax.compress.genome`). Each candidate is fine-tuned
briefly from the trained weights and scored on the valid rows; the test rows are
scored too, only to be reported.

Each generation is ONE compiled program: `jax.vmap` over genomes of a `lax.scan`
of the shared train step (`sfjax.train.step.make_train_step`) on the masked model
(masks are traced arrays of one padded shape, so no candidate compiles its own
program): Adam on the dense params, row-wise Adam on the embedding rows the
fine-tune batches touch (`finetune_batches`: T rows, host VSI). The trained params
and table are shared inputs; every candidate holds its own copy of the T touched
rows only ([P, T, E]; with `tune_table=False` they stay as trained).
The loop is `sfjax.automl.pareto_evolution.evolve` (parents: the best of
everything evaluated so far by (Pareto rank, valid AUC), NSGA-II's elitism
without crowding; children their mutations); `search` returns every evaluated
candidate, whose front and pick `pareto_evolution.candidate_front` / `choose` give.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sfjax.automl import pareto_evolution
from sfjax.compress import genome as genome_lib
from sfjax.compress import prune as ctr_prune
from sfjax.core import metrics as metrics_lib
from sfjax.core.types import DeviceBatch
from sfjax.embedding import device_table, row_optimizers, vsi
from sfjax.train import optimizers
from sfjax.train import step as step_lib
from sfjax.train.state import TrainState


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


class FinetuneBatches(NamedTuple):
  """The fine-tune batches as the shared train step reads them, on the rows they touch.

  Attributes:
    rows: [T] int64 sorted global ids of every row the batches touch; the tuned
      table holds these rows only (compact row r is `rows[r]`; a row no batch
      touches is never trained, so it stays as it was).
    batches: `DeviceBatch` with a leading [S] step axis whose `rows` index the
      compact [T] table (T: padding).
  """

  rows: np.ndarray
  batches: DeviceBatch


def finetune_batches(train: Examples) -> FinetuneBatches:
  """Host VSI of `train` [S, B, ...] against the compact table of the rows it touches."""
  steps, batch, fields = train.ids.shape
  rows = np.unique(train.ids)
  out = []
  for s in range(steps):
    virt = vsi.dedup_ids(np.searchsorted(rows, train.ids[s]), batch * fields, pad_id=rows.size)
    out.append(DeviceBatch(virt.uniq.astype(np.int32), virt.vids, train.dense[s],
                           train.labels[s], np.ones(batch, np.float32)))
  return FinetuneBatches(rows, jax.tree.map(lambda *a: np.stack(a), *out))


def _compact_ids(rows: np.ndarray, ids: np.ndarray) -> np.ndarray:
  """[..., F] int32: each id's compact row in `rows`, or len(rows) for an id not there."""
  pos = np.minimum(np.searchsorted(rows, ids), max(rows.size - 1, 0))
  hit = rows[pos] == ids if rows.size else np.zeros(ids.shape, bool)
  return np.where(hit, pos, rows.size).astype(np.int32)


def with_tuned_rows(values, data: FinetuneBatches, tuned_rows) -> np.ndarray:
  """[V, E] `values` with the fine-tuned rows written back (host)."""
  out = np.array(values, copy=True)
  out[data.rows] = np.asarray(tuned_rows)
  return out


def finetune(graphdef, spec: ctr_prune.PruneSpec, params: dict, values, genome,
             data: FinetuneBatches, learning_rate, tune_table: bool = True):
  """Adam steps over `data` [S] on the genome's masked model, through the shared train step.

  The model is `ctr_prune.masked_model` with the dropped units' weights at 0 and
  held there by the step's `dense_mask`; the dense params take Adam
  (`optimizers.dense_optimizer`), the touched rows row-wise Adam
  (`row_optimizers.adam`, the same rate) unless `tune_table` is False. Traceable
  in `genome` (one program for every candidate; vmapped by `_make_evaluator`).

  Returns:
    (params, tuned_rows [T, E]): the tuned dense params (pure dict) and the rows
    `data.rows` after the fine-tune (unchanged without `tune_table`).
  """
  genome = jnp.asarray(genome)
  graph, state = nnx.split(ctr_prune.masked_model(graphdef, spec, params, genome))
  keep = ctr_prune.masked_model(graphdef, spec, jax.tree.map(jnp.ones_like, params), genome)
  dense_mask = nnx.state(keep, nnx.Param)  # 0 on the dropped units' weights, 1 elsewhere
  tx = optimizers.dense_optimizer("adam", learning_rate)
  row_opt = row_optimizers.adam(learning_rate) if tune_table else row_optimizers.sgd(0.0)
  rows = jnp.take(jnp.asarray(values), jnp.asarray(data.rows, jnp.int32), axis=0)  # [T, E]
  slot_row = jnp.asarray(row_opt.initial_slot_row(rows.shape[1]))
  slots = jnp.broadcast_to(slot_row, (rows.shape[0], slot_row.shape[0]))  # [T, S]
  start = TrainState(jnp.zeros((), jnp.int32), state, tx.init(nnx.state(state, nnx.Param)),
                     device_table.TableState(rows, slots))
  step = step_lib.make_train_step(graph, tx, row_opt, dense_mask=dense_mask, model_variables=True)
  end, _ = jax.lax.scan(lambda st, batch: step(st, batch), start,
                        jax.tree.map(jnp.asarray, data.batches))
  return nnx.to_pure_dict(end.params)["model"], end.table.values


def _chunked_logits(fn: Callable, arrays: tuple, chunk: int) -> jax.Array:
  """`fn(*chunk_arrays) -> [c]` over arrays `[N, ...]` in chunks of `chunk` (padded), as [N]."""
  n = arrays[0].shape[0]
  pad = -n % chunk
  # An explicit chunk count: `-1` cannot be inferred from a zero-size array (no dense features).
  chunks = tuple(jnp.pad(jnp.asarray(a), ((0, pad),) + ((0, 0),) * (a.ndim - 1))
                 .reshape((n + pad) // chunk, chunk, *a.shape[1:]) for a in arrays)
  return jax.lax.map(lambda xs: fn(*xs), chunks).reshape(-1)[:n]


class _Evaluator:
  """`evaluate(genomes [P, G]) -> (valid_auc [P], test_auc [P])` over a vmapped program.

  Attributes:
    traces: how many times the program was traced (1 per population size P).
  """

  def __init__(self, run: Callable, args: tuple, data: CompressData):
    self.traces = 0
    self._run, self._args, self._data = run, args, data

  def __call__(self, genomes) -> tuple[np.ndarray, np.ndarray]:
    valid_logits, test_logits = jax.device_get(self._run(jnp.asarray(genomes, jnp.int32),
                                                         *self._args))
    valid = [metrics_lib.auc(self._data.valid.labels, s) for s in valid_logits]
    test = [metrics_lib.auc(self._data.test.labels, s) for s in test_logits]
    return np.asarray(valid), np.asarray(test)


def _make_evaluator(graphdef, spec: ctr_prune.PruneSpec, params: dict, values,
                    data: CompressData, learning_rate: float, tune_table: bool = True,
                    eval_chunk: int = 4096,
                    compiler_options: Mapping[str, str] | None = None) -> _Evaluator:
  """`evaluate(genomes [P, G]) -> (valid_auc [P], test_auc [P])`: a vmapped fine-tune.

  Every genome starts from `params` / `values` and takes the same steps over
  `data.train` on its masked model (`finetune`), so candidates differ only by
  their genome. Each candidate holds only its own copy of the touched rows
  ([P, T, E]); scoring reads a row from them when tuned, else from the shared
  `values`. One compiled program serves every population of the same P;
  `evaluate.traces` counts the traces (1 per population size).
  """
  batches = finetune_batches(data.train)
  splits = [(rows.ids, _compact_ids(batches.rows, rows.ids), rows.dense)
            for rows in (data.valid, data.test)]

  def one(genome, params, values, batches, valid, test):
    evaluate.traces += 1  # Python runs here only while tracing
    tuned, rows = finetune(graphdef, spec, params, values, genome, batches, learning_rate,
                           tune_table)
    model = ctr_prune.masked_model(graphdef, spec, tuned, genome)

    def score(ids, compact, dense):
      emb = jnp.where((compact < rows.shape[0])[..., None],
                      jnp.take(rows, compact, axis=0, mode="fill", fill_value=0),
                      jnp.take(values, ids, axis=0))  # [c, F, E]
      return model(emb, dense)

    return _chunked_logits(score, valid, eval_chunk), _chunked_logits(score, test, eval_chunk)

  run = jax.jit(jax.vmap(one, in_axes=(0, None, None, None, None, None)),
                compiler_options=dict(compiler_options or {}))
  evaluate = _Evaluator(run, (params, values, batches, *splits), data)
  return evaluate


def _random_genomes(rng: np.random.Generator, spec: ctr_prune.PruneSpec, n: int) -> np.ndarray:
  """[n, G] genomes probing each axis alone and together.

  Row 0 is the unpruned model (it anchors the front); then, in turn, a mixed
  genome (each layer keeps a random share in [0.25, 1], `genome.random_unit_bits`;
  random k and b), a table-only one (every unit kept, random k and b) and an
  MLP-only one (random shares, k = D, the widest bits), so the first generation
  measures each axis.
  """
  out = np.tile(ctr_prune.full_genome(spec), (n, 1))
  for i in range(1, n):
    kind = (i - 1) % 3
    if kind != 1:  # mixed or MLP-only: random unit shares
      out[i, :-2] = genome_lib.random_unit_bits(rng, spec.hidden)
    if kind != 2:  # mixed or table-only: random k and bits
      out[i, -2] = rng.choice(spec.dim_choices)
      out[i, -1] = rng.choice(spec.bit_choices)
  return out


def _mutate(rng: np.random.Generator, spec: ctr_prune.PruneSpec, genome: np.ndarray,
            rate: float) -> np.ndarray:
  """`genome.mutate_genome` on the spec's layout: each unit bit flips with probability `rate`, k
  and b each move one choice up or down with probability `rate`; a layer never loses all
  its units."""
  return genome_lib.mutate_genome(rng, ctr_prune.genome_layout(spec), genome, rate)


def search(graphdef, spec: ctr_prune.PruneSpec, params: dict, values, data: CompressData, *,
           population: int, generations: int, learning_rate: float, mutation_rate: float,
           seed: int, tune_table: bool = True, compiler_options: Mapping[str, str] | None = None,
           ) -> list[pareto_evolution.Candidate]:
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
    tune_table: fine-tune the touched embedding rows too (a copy per candidate).
    compiler_options: XLA's, for the vmapped fine-tune (`sfjax.core.xla_cpu_dots`: the
      trainer's `train.xla_cpu_dots` on CPU); None: XLA's defaults.
  """
  rng = np.random.default_rng(seed)
  evaluate = _make_evaluator(graphdef, spec, params, values, data, learning_rate, tune_table,
                             compiler_options=compiler_options)
  num_rows = int(values.shape[0])
  return pareto_evolution.evolve(
      _random_genomes(rng, spec, population), evaluate,
      lambda g: ctr_prune.pruned_bits(spec, num_rows, g),
      lambda r, g: _mutate(r, spec, g, mutation_rate), generations, rng,
      size_of=lambda g: ctr_prune.pruned_size(spec, num_rows, g))


def score(graphdef, params: dict, values, rows: Examples, chunk: int = 4096,
          compiler_options: Mapping[str, str] | None = None) -> np.ndarray:
  """[N] logits of a plain (unmasked or physically pruned) model on `rows` (compiled with
  XLA's `compiler_options`; None: its defaults)."""
  fn = jax.jit(lambda p, v, ids, dense: _chunked_logits(
      lambda i, d: ctr_prune.logits(graphdef, p, v, i, d), (ids, dense), chunk),
               compiler_options=dict(compiler_options or {}))
  return np.asarray(fn(params, values, rows.ids, rows.dense))
