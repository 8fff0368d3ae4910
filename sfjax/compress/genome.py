"""Compression genomes: unit keep-bits and choice genes, drawn and mutated one way.

VEGA's Prune-EA / Quant-EA (arXiv 2011.01507) search int genomes laid out as

  genome[:sum(widths)]   0/1 keep-bits over the units of L layers (layer l: widths[l] bits)
  genome[sum(widths):]   choice genes, gene i one value of its ascending `choices[i]`

The CTR search (`sfjax.compress.prune_search`: MLP units, then the kept dim k and
the table bits b) and the CNN search (`sfjax.vision.compression`: conv/dense units,
or one bit width per layer) use the same draw of unit bits and the same
mutation. No layer ever keeps no unit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


class GenomeLayout(NamedTuple):
  """Where a genome's genes are (static, hashable).

  Attributes:
    widths: units per layer; the first sum(widths) genes are their keep-bits.
    choices: one ascending tuple of allowed values per choice gene, after the bits.
  """

  widths: tuple[int, ...]
  choices: tuple[tuple[int, ...], ...] = ()

  @property
  def num_bits(self) -> int:
    """sum(widths): the keep-bit genes."""
    return int(sum(self.widths))

  @property
  def length(self) -> int:
    """G: keep-bits plus choice genes."""
    return self.num_bits + len(self.choices)


def random_unit_bits(rng: np.random.Generator, widths: Sequence[int]) -> np.ndarray:
  """[sum(widths)] int32 keep-bits: each layer keeps a random share in [0.25, 1] of its units.

  Per layer, in order: the share (uniform), then which units (without replacement);
  at least one unit.
  """
  out = np.zeros(int(sum(widths)), np.int32)
  start = 0
  for width in widths:
    share = rng.uniform(0.25, 1.0)
    keep = rng.choice(width, size=max(1, int(round(width * share))), replace=False)
    out[start + keep] = 1
    start += width
  return out


def _fix_empty_layers(rng: np.random.Generator, bits: np.ndarray,
                      widths: Sequence[int]) -> np.ndarray:
  """`bits` (modified in place) with one random unit kept in each layer that kept none."""
  start = 0
  for width in widths:
    if not bits[start:start + width].any():
      bits[start + rng.integers(width)] = 1
    start += width
  return bits


def mutate_genome(rng: np.random.Generator, layout: GenomeLayout, genome, rate: float) -> np.ndarray:
  """A mutated copy of `genome` [G].

  Each keep-bit flips with probability `rate`; each choice gene moves one choice up
  or down (clipped at the ends) with probability `rate`; then `_fix_empty_layers`.
  The random stream: one uniform per bit, then one uniform and one direction per
  choice gene, then the fixes (none drawn for an empty part).

  Raises:
    ValueError: naming `genome` when its length is not the layout's.
  """
  genome = np.array(genome, np.int32)
  if genome.shape != (layout.length,):
    raise ValueError(f"genome: shape {genome.shape}, expected ({layout.length},) = "
                     f"{layout.num_bits} unit bits + {len(layout.choices)} choice genes")
  bits = genome[:layout.num_bits]
  if layout.num_bits:
    flips = rng.random(bits.shape) < rate
    bits[:] = np.where(flips, 1 - bits, bits)
  if layout.choices:
    moves = rng.random(len(layout.choices)) < rate
    steps = rng.choice([-1, 1], len(layout.choices))
    for i, choices in enumerate(layout.choices):
      if moves[i]:
        index = choices.index(int(genome[layout.num_bits + i])) + int(steps[i])
        genome[layout.num_bits + i] = choices[int(np.clip(index, 0, len(choices) - 1))]
  _fix_empty_layers(rng, bits, layout.widths)
  return genome
