"""An algorithm's settings, read off its spec: the config block of each algorithm.

A search config holds one block per registered algorithm (`study.<name>.<field>`,
e.g. `study.asha.eta`, `study.pbt.population_size`), generated here from the
spec's dataclass fields and their defaults, so a new algorithm needs no config
edit and a setting has one meaning: its algorithm's. Fields a caller fills from
elsewhere (the seed; a search's shared budgets) are left out of the block.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from sfjax.automl.algorithms.base import AlgorithmSpec

# Every spec has a `seed`; a search seeds its algorithm from its own seed.
SEED_FIELD = ("seed",)


def default_block(spec_class: type[AlgorithmSpec],
                  exclude: Sequence[str] = SEED_FIELD) -> dict[str, Any]:
  """`{field: default}` of the spec's dataclass fields, minus `exclude`, in field order.

  Raises:
    TypeError: a field without a default (a spec must build with defaults alone).
  """
  block = {}
  for f in dataclasses.fields(spec_class):
    if f.name in exclude:
      continue
    if f.default is not dataclasses.MISSING:
      block[f.name] = f.default
    elif f.default_factory is not dataclasses.MISSING:
      block[f.name] = f.default_factory()
    else:
      raise TypeError(f"{spec_class.__name__}.{f.name}: a spec field needs a default")
  return block


def default_blocks(registry: Mapping[str, type[AlgorithmSpec]],
                   exclude: Sequence[str] = SEED_FIELD) -> dict[str, dict[str, Any]]:
  """`{name: default_block(spec)}` of every algorithm of `registry` (name -> spec class)."""
  return {name: default_block(spec, exclude) for name, spec in registry.items()}


def setting_types(spec_class: type[AlgorithmSpec]) -> dict[str, type]:
  """`{field: type}` of the spec's fields; `X | None` reads as `X` (what a typed config
  placeholder of a None default holds)."""
  hints = typing.get_type_hints(spec_class)
  out = {}
  for f in dataclasses.fields(spec_class):
    hint = hints[f.name]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
      args = [a for a in typing.get_args(hint) if a is not type(None)]
      hint = args[0] if len(args) == 1 else object
    out[f.name] = hint if isinstance(hint, type) else object
  return out
