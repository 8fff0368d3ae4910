"""What the CTR search needs from a concrete search space, passed in by the application.

The library never imports `search_spaces/`: a concrete space module builds a
`CTRSearchSpace` and the entry point hands it to `search_loop.run_search`
(`experiments/search.py` passes `search_spaces.default.SEARCH_SPACE`: models generated
from blocks, or the named families of `search_spaces.ctr` when `space.families` names
any). Points of the space are trial configs once `runner_config` has mapped them to the
keys `sfjax.cohorts.arch.split_config` reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from sfjax.automl.space import Config, Space


class CTRSearchSpace(NamedTuple):
  """A concrete CTR search space, as functions.

  Attributes:
    from_config: the joint space of a search config's `space` block.
    default_config: the unsearched baseline (the trainer's default model) as a
      point of the given space (None: the space with every family).
    fixed_arch_space: the hyperparameter space around one architecture (PBT).
    arch_part: the architecture (static) keys of a point.
    runner_config: a point -> the trial runner's keys (`arch.split_config`).
    zero_allowed: hyperparameter keys whose value may be exactly 0 (gated
      regularisers): PBT clips them from 0, not from the space's lower bound.
    bucket_fixed_keys: architecture-aware asking (`search_round.ask_round`): given
      the first config of a round and every key of the space, the keys to fix to
      its values so that new configs share its shape bucket (`padded.bucket_key`).
      None: `padded.fixed_config_keys` over the space's `arch.STATIC_KEYS`.
  """

  from_config: Callable[[Any], Space]
  default_config: Callable[[Space | None], Config]
  fixed_arch_space: Callable[[Mapping[str, Any]], Space]
  arch_part: Callable[[Mapping[str, Any]], dict[str, Any]]
  runner_config: Callable[[Mapping[str, Any]], dict[str, Any]]
  zero_allowed: frozenset[str] = frozenset()
  bucket_fixed_keys: Callable[[Mapping[str, Any], Sequence[str]], tuple[str, ...]] | None = None
