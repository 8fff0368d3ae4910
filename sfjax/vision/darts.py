"""A DARTS supernet, first-order bilevel search, genotype, and the derived network.

Cell (shared architecture alpha [E, len(OPS)] across cells, as DARTS' normal cells):
inputs s0 (the cell before the previous, or the stem) and s1 (the previous cell);
intermediate node i = sum over its inputs j < 2 + i of mixed_op(edge (i, j), state j);
the cell's output is the mean of its intermediate nodes (keeps C channels).
Network: stem conv3x3(in -> C) -> `num_cells` cells -> mean over a G x G grid
-> dense(G * G * C -> classes).

Search (Liu et al. 2019, first order): each step updates alpha by the gradient of
the *valid* loss at the current weights, then the weights by the gradient of the
*train* loss at the new alpha; both with Adam (optax), each through the shared
dense update (`sfjax.train.step.dense_update`). The genotype keeps, per
node, the two incoming edges whose strongest non-zero op weighs most, with that op.
`derived_network(genotype, ...)` builds that discrete network, trained from scratch.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sfjax.train import step as step_lib
from sfjax.vision import conv_layers as layers
from sfjax.vision import training
from sfjax.vision.darts_ops import OPS, ZERO, apply_op, init_mixed_op, init_op, mixed_op

# A genotype: per intermediate node, its two (input state index, op name) pairs.
Genotype = tuple[tuple[tuple[int, str], ...], ...]


class SupernetSpec(NamedTuple):
  """Static shape of a supernet / derived network.

  Attributes:
    channels: C of every cell.
    num_cells: cells stacked.
    num_nodes: intermediate nodes per cell.
    in_channels, num_classes: of the data.
    head_grid: the last cell is average-pooled to a head_grid x head_grid grid
      (H and W divisible by it) and flattened into the classifier, so the head
      sees where strokes are (a global mean would not).
  """

  channels: int = 8
  num_cells: int = 1
  num_nodes: int = 2
  in_channels: int = 1
  num_classes: int = 10
  head_grid: int = 4

  @property
  def num_edges(self) -> int:
    """Edges of a cell: node i has 2 + i inputs."""
    return sum(2 + i for i in range(self.num_nodes))


class DartsState(NamedTuple):
  """Search state: weights, architecture alpha [E, len(OPS)], and their Adam states."""

  weights: dict
  alpha: jax.Array
  weights_opt: optax.OptState
  alpha_opt: optax.OptState


def _edge_index(node: int, source: int) -> int:
  """The index in alpha's rows of the edge from state `source` into node `node`."""
  return sum(2 + i for i in range(node)) + source


def _stem_and_head(key, spec: SupernetSpec) -> tuple[dict, dict]:
  k1, k2 = jax.random.split(key)
  return (layers.conv_init(k1, spec.in_channels, spec.channels),
          layers.dense_init(k2, spec.channels * spec.head_grid ** 2, spec.num_classes))


def _init_supernet(key: jax.Array, spec: SupernetSpec) -> tuple[dict, jax.Array]:
  """(weights, alpha [E, len(OPS)] = 0, i.e. uniform op weights) of the supernet."""
  k_io, k_cells = jax.random.split(key)
  stem, head = _stem_and_head(k_io, spec)
  cells = {}
  for c, kc in enumerate(jax.random.split(k_cells, spec.num_cells)):
    edge_keys = jax.random.split(kc, spec.num_edges)
    cells[f"cell{c}"] = {f"e{e}": init_mixed_op(edge_keys[e], spec.channels)
                         for e in range(spec.num_edges)}
  alpha = jnp.zeros((spec.num_edges, len(OPS)), jnp.float32)
  return {"stem": stem, "cells": cells, "head": head}, alpha


def _network(params: dict, x: jax.Array, spec: SupernetSpec,
             edge_fn: Callable[[dict, int, int, jax.Array], jax.Array]) -> jax.Array:
  """Stem, cells (node i = sum_j edge_fn(cell, i, j, state_j)), mean of nodes, head.

  The sums run in sum()'s order, without its int 0 start (`functools.reduce`).
  """
  s = jax.nn.relu(layers.conv2d(x, params["stem"]["w"]) + params["stem"]["b"])
  s0 = s1 = s
  for c in range(spec.num_cells):
    cell = params["cells"][f"cell{c}"]
    states = [s0, s1]
    for node in range(spec.num_nodes):
      states.append(functools.reduce(operator.add, (edge_fn(cell, node, j, h)
                                                    for j, h in enumerate(states)
                                                    if h is not None)))
    s0, s1 = s1, functools.reduce(operator.add, states[2:]) / spec.num_nodes
  return _grid_pool(s1, spec.head_grid) @ params["head"]["w"] + params["head"]["b"]


def _grid_pool(x: jax.Array, grid: int) -> jax.Array:
  """[B, H, W, C] averaged over `grid` x `grid` equal blocks -> [B, grid * grid * C]."""
  b, h, w, c = x.shape
  if h % grid or w % grid:
    raise ValueError(f"image side {h}x{w} is not divisible by head_grid {grid}")
  return x.reshape(b, grid, h // grid, grid, w // grid, c).mean(axis=(2, 4)).reshape(b, -1)


def _apply_supernet(weights: dict, alpha: jax.Array, x: jax.Array,
                    spec: SupernetSpec) -> jax.Array:
  """Logits [B, classes] of the supernet on x [B, H, W, C_in]."""
  def edge(cell, node, source, h):
    e = _edge_index(node, source)
    return mixed_op(cell[f"e{e}"], alpha[e], h)
  return _network(weights, x, spec, edge)


def _init_search(key: jax.Array, spec: SupernetSpec, weights_lr: float, alpha_lr: float):
  """(state, weights_tx, alpha_tx) of a fresh search."""
  weights, alpha = _init_supernet(key, spec)
  w_tx = optax.adamw(weights_lr, weight_decay=3e-4)
  a_tx = optax.adam(alpha_lr, b1=0.5, b2=0.999)  # DARTS' architecture optimizer
  return DartsState(weights, alpha, w_tx.init(weights), a_tx.init(alpha)), w_tx, a_tx


def _make_search_step(spec: SupernetSpec, w_tx, a_tx):
  """`step(state, train_batch, valid_batch) -> (state, metrics)`: first-order DARTS.

  Batches are (x [B, H, W, C], y [B]). Alpha sees only the valid batch; the
  weights only the train batch.
  """
  def loss(weights, alpha, batch):
    x, y = batch
    return training.cross_entropy(_apply_supernet(weights, alpha, x, spec), y)

  def step(state: DartsState, train_batch, valid_batch):
    valid_loss, a_grad = jax.value_and_grad(loss, argnums=1)(state.weights, state.alpha,
                                                             valid_batch)
    alpha, alpha_opt = step_lib.dense_update(a_tx, a_grad, state.alpha_opt, state.alpha)
    train_loss, w_grad = jax.value_and_grad(loss)(state.weights, alpha, train_batch)
    weights, weights_opt = step_lib.dense_update(w_tx, w_grad, state.weights_opt, state.weights)
    return (DartsState(weights, alpha, weights_opt, alpha_opt),
            {"train_loss": train_loss, "valid_loss": valid_loss})

  return step


def run_darts_search(splits, spec: SupernetSpec, steps: int, batch_size: int, weights_lr: float,
               alpha_lr: float, seed: int) -> tuple[DartsState, dict]:
  """`steps` bilevel steps on random train / valid batches (one jitted scan).

  Returns:
    (final state, {'train_loss', 'valid_loss', 'supernet_valid_accuracy'}).
  """
  key = jax.random.key(seed)
  state, w_tx, a_tx = _init_search(key, spec, weights_lr, alpha_lr)
  step = _make_search_step(spec, w_tx, a_tx)

  @jax.jit
  def search(state, tx, ty, vx, vy, key):
    def body(s, i):
      kt, kv = jax.random.split(jax.random.fold_in(key, i))
      ti = jax.random.randint(kt, (batch_size,), 0, tx.shape[0])
      vi = jax.random.randint(kv, (batch_size,), 0, vx.shape[0])
      return step(s, (tx[ti], ty[ti]), (vx[vi], vy[vi]))
    state, metrics = jax.lax.scan(body, state, jnp.arange(steps))
    acc = training.accuracy(lambda w, x: _apply_supernet(w, state.alpha, x, spec),
                            state.weights, vx, vy)
    return state, metrics, acc

  state, metrics, acc = search(state, splits.train_x, splits.train_y, splits.valid_x,
                               splits.valid_y, jax.random.fold_in(key, 1))
  tail = max(1, steps // 10)
  return state, {"train_loss": float(metrics["train_loss"][-tail:].mean()),
                 "valid_loss": float(metrics["valid_loss"][-tail:].mean()),
                 "supernet_valid_accuracy": float(acc)}


def discretize(alpha, num_nodes: int, keep: int = 2) -> Genotype:
  """DARTS' genotype: per node, the `keep` inputs whose best non-zero op weighs most.

  Args:
    alpha: [E, len(OPS)] architecture logits.
    num_nodes: intermediate nodes of the cell.

  Returns:
    ((source, op), ...) per node, sources ascending.
  """
  weights = np.asarray(jax.nn.softmax(jnp.asarray(alpha), axis=-1))
  nonzero = [k for k, name in enumerate(OPS) if name != ZERO]
  genotype = []
  for node in range(num_nodes):
    candidates = []
    for source in range(2 + node):
      row = weights[_edge_index(node, source)]
      best = max(nonzero, key=lambda k: row[k])
      candidates.append((-row[best], source, OPS[best]))
    chosen = sorted(candidates)[:keep]
    genotype.append(tuple(sorted((source, op) for _, source, op in chosen)))
  return tuple(genotype)


def _random_genotype(rng: np.random.Generator, num_nodes: int, keep: int = 2) -> Genotype:
  """A random cell in `discretize`'s form: the random-search baseline of DARTS.

  Per node, `keep` distinct earlier states drawn uniformly, each with an op drawn
  uniformly from the non-zero ops; sources ascending.
  """
  nonzero = [name for name in OPS if name != ZERO]
  genotype = []
  for node in range(num_nodes):
    sources = rng.choice(2 + node, size=min(keep, 2 + node), replace=False)
    genotype.append(tuple(sorted((int(s), nonzero[rng.integers(len(nonzero))])
                                 for s in sources)))
  return tuple(genotype)


def genotype_from_json(data: Sequence) -> Genotype:
  """A genotype from its JSON form ([[[source, op], ...], ...]), checked.

  Raises:
    ValueError: an unknown op or a source that is not an earlier state.
  """
  genotype = []
  for node, pairs in enumerate(data):
    for source, op in pairs:
      if op not in OPS or op == ZERO:
        raise ValueError(f"genotype node {node}: unknown op {op!r} (known: {OPS[:-1]})")
      if not 0 <= int(source) < 2 + node:
        raise ValueError(f"genotype node {node}: source {source} is not an earlier state")
    genotype.append(tuple((int(s), str(o)) for s, o in pairs))
  return tuple(genotype)


def init_derived(key: jax.Array, genotype: Genotype, spec: SupernetSpec) -> dict:
  """Fresh parameters of the discrete network of `genotype` (only its ops)."""
  k_io, k_cells = jax.random.split(key)
  stem, head = _stem_and_head(k_io, spec)
  cells = {}
  for c, kc in enumerate(jax.random.split(k_cells, spec.num_cells)):
    keys = jax.random.split(kc, spec.num_edges)
    cells[f"cell{c}"] = {f"e{_edge_index(n, s)}": init_op(keys[_edge_index(n, s)], op, spec.channels)
                         for n, pairs in enumerate(genotype) for s, op in pairs}
  return {"stem": stem, "cells": cells, "head": head}


def apply_derived(params: dict, x: jax.Array, genotype: Genotype,
                  spec: SupernetSpec) -> jax.Array:
  """Logits [B, classes] of the discrete network of `genotype` on x [B, H, W, C_in]."""
  ops = {(n, s): op for n, pairs in enumerate(genotype) for s, op in pairs}

  def edge(cell, node, source, h):
    op = ops.get((node, source))
    if op is None:
      return jnp.zeros_like(h)  # adds as the 0.0 it stands for
    return apply_op(op, cell[f"e{_edge_index(node, source)}"], h)
  return _network(params, x, spec._replace(num_nodes=len(genotype)), edge)
