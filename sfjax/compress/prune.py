"""Structured pruning (MLP neurons, embedding dims) and row quantization of a CTR model.

The model surgery behind `prune_search` (VEGA's Prune-EA / Quant-EA, arXiv
2011.01507, applied to a CTR model). A genome is one int vector `[H_1 + ... + H_L + 2]`
(`genome_layout`: `sfjax.compress.genome`'s unit bits and two choice genes):

  genome[:sum(H)]  0/1 keep-bits over the hidden units of the model's MLP tower
                   (`model.mlp.hidden`, Linear + ReLU layers): whole neurons;
  genome[-2]       k, the latent embedding dimensions every field keeps (one k for
                   all fields: the FM / CIN terms take products of two fields'
                   vectors, which need equal widths);
  genome[-1]       b, the bits of every stored table value (`quant`: b-bit codes
                   and a scale per row; 32 = float rows, no quantization).

The masked model (`masked_model`) computes `relu(x @ (W * m) + b * m)` per hidden
layer and reads `fake_quant_rows(emb * column_mask(k), b)` (`MaskedRows`); the
physically pruned model (`prune`) is the same model class built with
`mlp_dims = kept units` and `embed_dim = k`, its kernels sliced: a dropped unit
outputs relu(0) = 0 and a dropped column is 0, so both compute the same logits
(its table is stored as codes + scales and read dequantized, the same values the
fake quantization computes). Columns are kept in order, so put the important ones
first with `order_columns` (which permutes the latent columns of every row and the matching
rows of the MLP's first kernel: the function is unchanged).

MLP pruning works for every model whose `mlp` ends in an output Linear (deepfm,
wide_deep, xdeepfm, autoint, dlrm, dcnv2 stacked); embedding-dimension pruning
for the models whose only D-shaped weights are that MLP's first-layer rows
(`_EMBED_PRUNABLE`: deepfm, wide_deep, xdeepfm; the CIN sum-pools over D).
Parameters are pure dicts (`nnx.to_pure_dict(state)`: hidden layers keyed 0..L-1).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sfjax.compress import genome as genome_lib
from sfjax.compress import quant as ctr_quant
from sfjax.models import registry

# The models whose D-shaped weights are only the MLP's first-layer rows, read as
# [v_1 (D) .. v_F (D), dense (Nd)].
_EMBED_PRUNABLE = ("deepfm", "wide_deep", "xdeepfm")


class PruneSpec(NamedTuple):
  """The static shape of a prunable model (hashable).

  Attributes:
    model_name: `model.name`.
    num_fields, num_dense: F, Nd.
    embed_dim: D, latent columns of every row (the first D of E).
    width: E, the row width (D + 1 for models with a first-order weight, kept last).
    hidden: (H_1, ..., H_L), the MLP tower's hidden widths.
    mlp_in: the MLP's input width.
    dim_choices: the k a genome may keep, ascending, ending in D.
    bit_choices: the table bit widths b a genome may take, ascending.
    hparams: the model's other `model.*` keys, as sorted (key, value) pairs.
  """

  model_name: str
  num_fields: int
  num_dense: int
  embed_dim: int
  width: int
  hidden: tuple[int, ...]
  mlp_in: int
  dim_choices: tuple[int, ...]
  bit_choices: tuple[int, ...]
  hparams: tuple[tuple[str, Any], ...]

  @property
  def genome_length(self) -> int:
    """G = sum(hidden) + 2 (unit bits, k, b)."""
    return sum(self.hidden) + 2


def _hashable(value):
  return tuple(value) if isinstance(value, (list, tuple)) else value


def make_spec(model_cfg: Mapping[str, Any], num_fields: int, num_dense: int,
              dim_choices: Sequence[int] | None = None,
              bit_choices: Sequence[int] = (ctr_quant.FLOAT_BITS,)) -> PruneSpec:
  """The `PruneSpec` of the model a trainer config's `model` block describes.

  Args:
    model_cfg: `name`, `embed_dim`, `mlp_dims` and the other `model.*` keys.
    num_fields, num_dense: F and Nd of the data set.
    dim_choices: latent dims a candidate may keep (D is added); None: 1..D for
      `_EMBED_PRUNABLE` models, (D,) otherwise.
    bit_choices: table bit widths (`ctr_quant.ALLOWED_BITS`; (32,): no quantization).

  Raises:
    ValueError: naming `model.name` (no MLP tower with an output layer),
      `dim_choices` (a bad value, or k < D for a model outside `_EMBED_PRUNABLE`)
      or `bit_choices`.
  """
  cfg = {k: _hashable(v) for k, v in dict(model_cfg).items()}
  name, embed_dim = cfg.pop("name"), int(cfg.pop("embed_dim"))
  hparams = tuple(sorted((k, v) for k, v in cfg.items() if k in registry.model_hparams(name)))
  model = nnx.eval_shape(lambda: registry.build_model(
      name, num_fields=num_fields, embed_dim=embed_dim, num_dense=num_dense,
      rngs=nnx.Rngs(0), **dict(hparams)))
  mlp = getattr(model, "mlp", None)
  if mlp is None or mlp.out is None or mlp.out_features != 1 or not len(mlp.hidden):
    raise ValueError(f"model.name: {name!r} has no MLP tower with hidden layers and an output "
                     "logit layer to prune (prunable: models with model.mlp_dims, e.g. deepfm)")
  hidden = tuple(int(layer.out_features) for layer in mlp.hidden)
  if dim_choices is None:
    dim_choices = range(1, embed_dim + 1) if name in _EMBED_PRUNABLE else (embed_dim,)
  dims = sorted({int(k) for k in dim_choices} | {embed_dim})
  if dims[0] < 1 or dims[-1] > embed_dim:
    raise ValueError(f"dim_choices: {tuple(dim_choices)} must lie in [1, model.embed_dim = "
                     f"{embed_dim}]")
  if len(dims) > 1 and name not in _EMBED_PRUNABLE:
    raise ValueError(f"dim_choices: model {name!r} supports only MLP pruning (k = "
                     f"model.embed_dim = {embed_dim}); embedding dims prune in "
                     f"{', '.join(_EMBED_PRUNABLE)}")
  width = registry.embedding_width(name, embed_dim)
  return PruneSpec(name, int(num_fields), int(num_dense), embed_dim, width, hidden,
                   int(mlp.hidden[0].in_features), tuple(dims),
                   ctr_quant.check_bit_choices(bit_choices), hparams)


def genome_layout(spec: PruneSpec) -> genome_lib.GenomeLayout:
  """The genome's layout: unit bits over `spec.hidden`, then k (`dim_choices`), b (`bit_choices`)."""
  return genome_lib.GenomeLayout(spec.hidden, (spec.dim_choices, spec.bit_choices))


def full_genome(spec: PruneSpec) -> np.ndarray:
  """[G] int32: every unit kept, k = D, the widest bits (the unpruned model)."""
  return np.concatenate([np.ones(sum(spec.hidden), np.int32),
                         [spec.embed_dim, spec.bit_choices[-1]]]).astype(np.int32)


def check_genome(spec: PruneSpec, genome) -> np.ndarray:
  """`genome` as a checked [G] int32 array.

  Raises:
    ValueError: naming `genome` (length, non-0/1 bits, an empty layer, k or b not a choice).
  """
  genome = np.asarray(genome)
  if genome.shape != (spec.genome_length,):
    raise ValueError(f"genome: shape {genome.shape}, expected ({spec.genome_length},) = "
                     f"hidden units {spec.hidden} + k + bits")
  bits, k, b = genome[:-2], int(genome[-2]), int(genome[-1])
  if not np.isin(bits, (0, 1)).all():
    raise ValueError("genome: the unit bits must be 0 or 1")
  for layer, m in enumerate(np.split(bits, np.cumsum(spec.hidden)[:-1])):
    if not m.any():
      raise ValueError(f"genome: hidden layer {layer} keeps no unit")
  if k not in spec.dim_choices:
    raise ValueError(f"genome: kept dim {k} is not one of dim_choices {spec.dim_choices}")
  if b not in spec.bit_choices:
    raise ValueError(f"genome: table bits {b} is not one of bit_choices {spec.bit_choices}")
  return genome.astype(np.int32)


def _unit_masks(spec: PruneSpec, genome) -> tuple[jax.Array, ...]:
  """The per-layer float keep-masks ([H_1], ..., [H_L]) of a genome (traceable)."""
  genome = jnp.asarray(genome)
  cuts = np.cumsum(spec.hidden)[:-1].tolist()
  return tuple(m.astype(jnp.float32) for m in jnp.split(genome[:-2], cuts))


def _column_mask(spec: PruneSpec, genome) -> jax.Array:
  """[E] float: 1 on the first k latent columns and on a first-order column (traceable)."""
  k = jnp.asarray(genome)[-2]
  col = jnp.arange(spec.width)
  return ((col < k) | (col >= spec.embed_dim)).astype(jnp.float32)


def _masked_params(params: dict, masks: Sequence[jax.Array]) -> dict:
  """`params` with hidden layer l's kernel columns and bias multiplied by `masks[l]`."""
  hidden = {i: {"kernel": layer["kernel"] * masks[i][None, :], "bias": layer["bias"] * masks[i]}
            for i, layer in params["mlp"]["hidden"].items()}
  return {**params, "mlp": {**params["mlp"], "hidden": hidden}}


def logits(graphdef, params: dict, values: jax.Array, ids: jax.Array,
           dense: jax.Array) -> jax.Array:
  """Model logits `[B]` from the table `values [V, E]`, global row ids `[B, F]` and dense."""
  return nnx.merge(graphdef, params)(jnp.take(values, ids, axis=0), dense)


class MaskedRows(nnx.Module):
  """A model reading its rows through a genome's column mask and row fake-quantization.

  `model(fake_quant_rows(emb * column_mask, bits), dense)`. The mask and the bits
  are plain `nnx.Variable`s, not parameters: a train step
  (`make_train_step(..., model_variables=True)`) carries them and trains only
  `model`'s parameters; under `jax.vmap` each candidate holds its own.
  """

  def __init__(self, model: nnx.Module, column_mask: jax.Array, bits):
    """Wraps `model` (already unit-masked) with `column_mask` [E] and the table `bits`."""
    self.model = model
    self.column_mask = nnx.Variable(jnp.asarray(column_mask, jnp.float32))
    self.bits = nnx.Variable(jnp.asarray(bits, jnp.int32))

  def __call__(self, emb: jax.Array, dense: jax.Array) -> jax.Array:
    """Maps `emb: [B, F, E]`, `dense: [B, Nd]` to logits `[B]`."""
    rows = ctr_quant.fake_quant_rows(emb * self.column_mask[...], self.bits[...])
    return self.model(rows, dense)


def masked_model(graphdef, spec: PruneSpec, params: dict, genome) -> MaskedRows:
  """The model with `genome`'s units masked (`_masked_params`), its columns masked and its
  rows fake-quantized (traceable genome)."""
  genome = jnp.asarray(genome)
  model = nnx.merge(graphdef, _masked_params(params, _unit_masks(spec, genome)))
  return MaskedRows(model, _column_mask(spec, genome), genome[-1])


def _masked_logits(graphdef, spec: PruneSpec, params: dict, values: jax.Array, genome,
                   ids: jax.Array, dense: jax.Array) -> jax.Array:
  """Logits `[B]` of `masked_model` on the rows `values[ids]` (traceable genome)."""
  return masked_model(graphdef, spec, params, genome)(jnp.take(values, ids, axis=0), dense)


def _first_layer_rows(spec: PruneSpec, cols: np.ndarray) -> np.ndarray:
  """Rows of the MLP's first kernel that read latent columns `cols` of every field, then dense."""
  fields = np.arange(spec.num_fields)[:, None] * spec.embed_dim
  dense = spec.num_fields * spec.embed_dim + np.arange(spec.num_dense)
  return np.concatenate([(fields + cols[None, :]).reshape(-1), dense])


def _take_columns(spec: PruneSpec, params: dict, values, cols: Sequence[int] | np.ndarray):
  """The model reading only latent columns `cols` (in that order) of every row.

  A permutation of range(D) leaves the function unchanged (`order_columns`); a
  prefix of one prunes (the dropped columns must be masked for equal logits).

  Returns:
    (params, values [V, len(cols) + E - D]) as numpy arrays: the MLP's first
    kernel keeps the matching rows; a first-order column stays last.
  """
  col_index = np.asarray(cols, np.int64)
  params, values = jax.tree.map(np.asarray, params), np.asarray(values)  # host slicing
  if spec.model_name not in _EMBED_PRUNABLE and not np.array_equal(col_index,
                                                                  np.arange(spec.embed_dim)):
    raise ValueError(f"model.name: {spec.model_name!r} does not support reordering or pruning "
                     f"embedding columns (supported: {', '.join(_EMBED_PRUNABLE)})")
  keep = np.concatenate([col_index, np.arange(spec.embed_dim, spec.width)])
  first = params["mlp"]["hidden"][0]
  rows = _first_layer_rows(spec, col_index)
  hidden = {**params["mlp"]["hidden"], 0: {**first, "kernel": first["kernel"][rows]}}
  return {**params, "mlp": {**params["mlp"], "hidden": hidden}}, values[:, keep]


def _column_order(spec: PruneSpec, values) -> np.ndarray:
  """[D] latent columns by decreasing L2 norm over every row (importance; ties by index)."""
  norms = np.linalg.norm(np.asarray(values, np.float64)[:, :spec.embed_dim], axis=0)
  return np.argsort(-norms, kind="stable")


def order_columns(spec: PruneSpec, params: dict, values):
  """`_take_columns` with `_column_order`: the same function, important columns first.

  Models outside `_EMBED_PRUNABLE` are returned unchanged.
  """
  if spec.model_name not in _EMBED_PRUNABLE:
    return params, values
  return _take_columns(spec, params, values, _column_order(spec, values))


class PrunedModel(NamedTuple):
  """A physically pruned model.

  Attributes:
    model_cfg: the `model.*` block that builds it (`embed_dim` = k, `mlp_dims` = kept units).
    graphdef: its NNX graph definition.
    params: its dense parameters (pure dict).
    values: [V, E_k] its embedding table as the model reads it (dequantized).
    bits: the table's stored bits per value (32: `values` is what is stored).
    codes: [V, E_k] int8 stored codes (None at 32 bits).
    scales: [V] float32 per-row scales (None at 32 bits).
  """

  model_cfg: dict
  graphdef: Any
  params: dict
  values: Any
  bits: int = ctr_quant.FLOAT_BITS
  codes: Any = None
  scales: Any = None


def pruned_model_cfg(spec: PruneSpec, genome) -> dict:
  """The `model.*` block of the genome's pruned model."""
  genome = check_genome(spec, genome)
  kept = tuple(int(m.sum()) for m in np.split(genome[:-2], np.cumsum(spec.hidden)[:-1]))
  return {"name": spec.model_name, "embed_dim": int(genome[-2]), **dict(spec.hparams),
          "mlp_dims": kept}


def _mlp_count(in_features: int, dims: Sequence[int]) -> int:
  """Parameters of Linear layers in_features -> dims... -> 1 (kernels and biases)."""
  widths = (in_features, *dims, 1)
  return sum(a * b + b for a, b in zip(widths[:-1], widths[1:], strict=True))


@functools.lru_cache(maxsize=64)
def _unpruned_count(spec: PruneSpec) -> int:
  model = nnx.eval_shape(lambda: registry.build_model(
      spec.model_name, num_fields=spec.num_fields, embed_dim=spec.embed_dim,
      num_dense=spec.num_dense, rngs=nnx.Rngs(0), **dict(spec.hparams)))
  return _param_count(nnx.to_pure_dict(nnx.state(model)))


def _dense_count(spec: PruneSpec, embed_dim: int, mlp_dims: tuple[int, ...]) -> int:
  """The unpruned model's dense parameters with its MLP swapped for the pruned one (the
  MLP holds every weight pruning changes; its input [v_1 .. v_F, dense] loses F x (D - k)
  columns, which only EMBED_PRUNABLE models allow)."""
  pruned_in = spec.mlp_in - spec.num_fields * (spec.embed_dim - embed_dim)
  return (_unpruned_count(spec) - _mlp_count(spec.mlp_in, spec.hidden)
          + _mlp_count(pruned_in, mlp_dims))


def _param_count(tree) -> int:
  """The number of scalars in a pytree of arrays (or shape structs)."""
  return int(sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree)))


def pruned_size(spec: PruneSpec, num_rows: int, genome) -> int:
  """Exact parameters of the genome's pruned model: V x E_k table + dense params."""
  cfg = pruned_model_cfg(spec, genome)
  width = registry.embedding_width(spec.model_name, cfg["embed_dim"])
  return int(num_rows) * width + _dense_count(spec, cfg["embed_dim"], cfg["mlp_dims"])


def pruned_bits(spec: PruneSpec, num_rows: int, genome) -> int:
  """Exact stored bits of the genome's model: its table at b bits (+ a scale per row when
  quantized) and float32 dense params."""
  genome = check_genome(spec, genome)
  cfg = pruned_model_cfg(spec, genome)
  width = registry.embedding_width(spec.model_name, cfg["embed_dim"])
  return (ctr_quant.table_bits(int(num_rows), width, int(genome[-1]))
          + ctr_quant.FLOAT_BITS * _dense_count(spec, cfg["embed_dim"], cfg["mlp_dims"]))


def prune(spec: PruneSpec, params: dict, values, genome) -> PrunedModel:
  """The genome's model with its dropped units and columns removed, its table quantized.

  Its logits equal `_masked_logits(..., genome, ...)` of the same params and table
  (its arrays are numpy: sliced on the host).
  """
  cfg = pruned_model_cfg(spec, genome)
  params, values = _take_columns(spec, params, values, np.arange(cfg["embed_dim"]))
  genome = check_genome(spec, genome)
  keeps = [np.flatnonzero(m) for m in np.split(genome[:-2], np.cumsum(spec.hidden)[:-1])]
  hidden = dict(params["mlp"]["hidden"])
  for i, keep in enumerate(keeps):
    hidden[i] = {"kernel": hidden[i]["kernel"][:, keep], "bias": hidden[i]["bias"][keep]}
    if i + 1 < len(keeps):
      hidden[i + 1] = {**hidden[i + 1], "kernel": hidden[i + 1]["kernel"][keep]}
  out = params["mlp"]["out"]
  out = {**out, "kernel": out["kernel"][keeps[-1]]}
  params = {**params, "mlp": {**params["mlp"], "hidden": hidden, "out": out}}
  model = nnx.eval_shape(lambda: registry.build_model(
      spec.model_name, num_fields=spec.num_fields, num_dense=spec.num_dense,
      rngs=nnx.Rngs(0), **{k: v for k, v in cfg.items() if k != "name"}))
  graphdef, _ = nnx.split(model)
  bits = int(genome[-1])
  if bits >= ctr_quant.FLOAT_BITS:
    return PrunedModel(cfg, graphdef, params, values)
  codes, scales = ctr_quant.table_codes(values, bits)
  return PrunedModel(cfg, graphdef, params, ctr_quant.dequantize(codes, scales), bits, codes,
                     scales)
