"""Compression search on a trained CNN: Prune-EA (unit masks) and Quant-EA (bit widths).

VEGA's Prune-EA / Quant-EA (arXiv 2011.01507): an evolutionary, multi-objective
search whose candidates are fine-tuned briefly from the trained weights and scored
on the valid split, trading accuracy (up) against size (down).

  pruning      genome = 0/1 keep-masks over the units of `cnn._PRUNABLE` (C1 + C2 + H
               bits); size = the pruned network's exact parameter count.
  quantization genome = a bit width per layer of `cnn.LAYERS` (from `bit_choices`),
               fine-tuned with fake quantization (straight-through); size = weight bits.

Each generation's population is fine-tuned as one `jax.vmap` of `training.fit`
over genomes (the trained weights are shared, not copied). The search loop is
`sfjax.automl.pareto_evolution` (valid accuracy up, size down): its `evolve`
with `make_evaluator`, a size function (`pruned_param_count` / `weight_bits`)
and a mutation (`mutate_masks` / `mutate_bits`: `sfjax.compress.genome`'s, shared with
the CTR search); its `pareto_front` and `choose` give the front and the pick, each candidate with its test accuracy (scored,
never used to select).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sfjax.compress import genome as genome_lib
from sfjax.vision import cnn, training

PRUNE, QUANT = "prune", "quant"


def split_masks(genome, widths: Sequence[int]) -> tuple:
  """(m1 [C1], m2 [C2], mh [H]) float masks from a flat genome [C1 + C2 + H]."""
  cuts = np.cumsum(widths)[:-1]
  return tuple(jnp.asarray(m, jnp.float32) for m in jnp.split(jnp.asarray(genome), cuts))


def pruned_param_count(genome, widths: Sequence[int], in_channels: int = 1,
                       num_classes: int = 10) -> int:
  """The exact parameter count of the CNN after removing the genome's 0 units."""
  kept = [int(np.sum(m)) for m in np.split(np.asarray(genome), np.cumsum(widths)[:-1])]
  return cnn.cnn_param_count(kept, in_channels, num_classes)


def weight_bits(genome, widths: Sequence[int], in_channels: int = 1,
                num_classes: int = 10) -> int:
  """Total bits of the CNN's weights with per-layer bit widths `genome` [4]."""
  sizes = cnn.layer_weight_sizes(widths, in_channels, num_classes)
  return int(sum(int(b) * s for b, s in zip(genome, sizes, strict=True)))


def _mask_layout(widths: Sequence[int]) -> genome_lib.GenomeLayout:
  """The pruning genome: keep-bits over the units of `cnn._PRUNABLE` (C1, C2, H)."""
  return genome_lib.GenomeLayout(tuple(int(w) for w in widths))


def _bits_layout(choices: Sequence[int]) -> genome_lib.GenomeLayout:
  """The quantization genome: one bit width (of `choices`) per layer of `cnn.LAYERS`."""
  return genome_lib.GenomeLayout((), (tuple(sorted(int(b) for b in choices)),) * len(cnn.LAYERS))


def random_masks(rng: np.random.Generator, widths: Sequence[int], n: int) -> np.ndarray:
  """[n, sum(widths)] 0/1 genomes (`genome.random_unit_bits`); row 0 keeps every unit."""
  out = np.stack([genome_lib.random_unit_bits(rng, widths) for _ in range(n)])
  out[0] = 1  # the unpruned network anchors the front
  return out


def mutate_masks(rng: np.random.Generator, genome: np.ndarray, widths: Sequence[int],
                 rate: float) -> np.ndarray:
  """Flips each bit with probability `rate`; a layer never loses all its units (`genome.mutate_genome`)."""
  return genome_lib.mutate_genome(rng, _mask_layout(widths), genome, rate)


def random_bits(rng: np.random.Generator, choices: Sequence[int], n: int) -> np.ndarray:
  """[n, len(cnn.LAYERS)] bit widths drawn from `choices`; row 0 is all max(choices)."""
  out = rng.choice(np.asarray(choices), size=(n, len(cnn.LAYERS))).astype(np.int32)
  out[0] = max(choices)
  return out


def mutate_bits(rng: np.random.Generator, genome: np.ndarray, choices: Sequence[int],
                rate: float) -> np.ndarray:
  """Moves each layer's bit width one choice up or down with probability `rate` (`genome.mutate_genome`)."""
  return genome_lib.mutate_genome(rng, _bits_layout(choices), genome, rate)


def make_evaluator(kind: str, params: dict, splits, steps: int, batch_size: int,
                   learning_rate: float, seed: int) -> Callable[[np.ndarray], tuple]:
  """`evaluate(genomes [P, G]) -> (valid_acc [P], test_acc [P])`: a vmapped fine-tune.

  Every genome starts from `params` and gets the same batches (the same key), so
  candidates differ only by their genome.
  """
  widths = cnn.widths_of(params)
  if kind not in (PRUNE, QUANT):
    raise ValueError(f"compression kind {kind!r} is not one of {(PRUNE, QUANT)}")

  def one(genome, tx, ty, vx, vy, sx, sy):
    def apply(p, x):
      if kind == PRUNE:
        return cnn.apply_cnn(p, x, masks=split_masks(genome, widths))
      return cnn.apply_cnn(p, x, bits=genome)

    tuned, _ = training.fit(apply, params, tx, ty, steps, batch_size, learning_rate, 0.0,
                            jax.random.key(seed))
    return training.accuracy(apply, tuned, vx, vy), training.accuracy(apply, tuned, sx, sy)

  run = jax.jit(jax.vmap(one, in_axes=(0,) + (None,) * 6))

  def evaluate(genomes):
    valid, test = run(jnp.asarray(genomes), splits.train_x, splits.train_y, splits.valid_x,
                      splits.valid_y, splits.test_x, splits.test_y)
    return np.asarray(valid), np.asarray(test)

  return evaluate
