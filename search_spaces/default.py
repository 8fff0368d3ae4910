"""The default CTR search space: models generated from blocks, the named models its presets.

    SEARCH_SPACE.from_config(config.space)  # space.families '' (the default): blocks.block_space
                                            # space.families 'fm,deepfm': ctr.ctr_space (named)
    run_search(config, workdir, SEARCH_SPACE)   # what experiments/search.py passes

DESIGN.md §4: the search space is a composable module generator. By default a search
draws models from the block generator (`search_spaces/blocks.py`); the eight named
models are points of it (`blocks.preset_config`), so nothing the named families offer
is lost. A search or pipeline step that names families (`space.families`) searches
the named-family space of `search_spaces/ctr.py` exactly as before (same space, same
trials, same results), and a trial config that names a model (`model.name`) still
trains that model: each function below dispatches on whether the space (or point)
holds `model.name`.

The unsearched baseline (`default_config(None)`: what a search's `default auc` is
measured on) stays the trainer's own DeepFM (`model.name=deepfm`) in both spaces.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from search_spaces import blocks, ctr
from sfjax.automl.space import Config, Space
from sfjax.cohorts import STATIC_KEYS, fixed_config_keys
from sfjax.ctr_search import CTRSearchSpace

_NAME_KEY = "model.name"  # held by the named-family space and its points, never by blocks'


def names_families(space_cfg) -> bool:
  """Whether a config's `space` block names model families (`space.families` non-empty)."""
  return bool(str(space_cfg.get("families", "") or "").strip())


def space_from_config(space_cfg) -> Space:
  """The named-family space when `space.families` names any (`ctr.space_from_config`), else
  the block generator's (`blocks.space_from_config`: `mlp_widths` are the tower's)."""
  if names_families(space_cfg):
    return ctr.space_from_config(space_cfg)
  return blocks.space_from_config(space_cfg)


def default_config(space: Space | None = None) -> Config:
  """The baseline as a point of `space`: the trainer's named DeepFM when `space` is None or
  the named-family space, its preset in a block space (`blocks.default_config`)."""
  if space is None or _NAME_KEY in space.keys:
    return ctr.default_config(space)
  return blocks.default_config(space)


def runner_config(config: Mapping[str, Any]) -> dict[str, Any]:
  """The trial runner's keys of a point of either space (a named model's or a generated one)."""
  if _NAME_KEY in config:
    return ctr.runner_config(config)
  return blocks.runner_config(config)


def bucket_fixed_keys(first: Mapping[str, Any], keys: Sequence[str]) -> tuple[str, ...]:
  """The keys to fix so that a point shares `first`'s shape bucket, in either space."""
  if _NAME_KEY in first:
    return fixed_config_keys(first, tuple(k for k in keys if k in STATIC_KEYS))
  return blocks.bucket_fixed_keys(first, keys)


# What `sfjax.ctr_search.search_loop.run_search` is given by default (experiments/search.py,
# and the pipeline's `search_space: ctr`).
SEARCH_SPACE = CTRSearchSpace(
    from_config=space_from_config, default_config=default_config,
    fixed_arch_space=ctr.fixed_arch_space, arch_part=ctr.arch_part, runner_config=runner_config,
    zero_allowed=frozenset(ctr.GATES.values()), bucket_fixed_keys=bucket_fixed_keys)
