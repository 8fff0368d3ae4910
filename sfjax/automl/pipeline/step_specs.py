"""A pipeline config: ordered steps, each with its own block and a registered step kind.

    config.pipeline.order = "nas,hpo,fully_train"   # the steps, run in this order
    config.steps.nas.type = "nas"                   # each step's block names its kind
    config.steps.nas.<field> = ...                  # and holds the kind's own settings

The kinds are a registry the application passes in (`{type: StepKind}`), so the
library knows no concrete step. A kind with library defaults (`StepKind.defaults`)
takes a block of overrides only: the step's block is its kind's defaults with the
config's values on top (`effective_blocks`), and a key the defaults lack is an
error naming the step, the key and the closest valid key. A step's outputs are
JSON written under its own directory `WORKDIR/steps/<index>_<name>/`; a later
step reads them through its `StepContext` (`latest(key)`: the newest earlier
step that produced `key`).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from sfjax.core import names
from sfjax.core.errors import ConfigError, unknown_key_error

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_MISSING = object()


class PipelineConfigError(ConfigError):
  """A bad pipeline config (names the dotted field), or a workdir made by another config."""


class MissingInputError(RuntimeError):
  """A step needs an output (e.g. `best_config`) that no earlier step produced."""


class StepOutput(NamedTuple):
  """What a step's run returns.

  Attributes:
    best_metrics: the step's headline metrics (flat name -> JSON scalar), for the report.
    output: JSON-able hand-off to later steps (best configs, selected pairs, paths
      relative to the pipeline workdir, ...).
  """

  best_metrics: Mapping[str, Any]
  output: Mapping[str, Any]


class StepKind(NamedTuple):
  """A registered kind of step.

  Attributes:
    run: `run(ctx: StepContext) -> StepOutput`; must resume its own work when
      called again on the same step directory after a crash.
    check: optional `check(block, field)`: raises `ConfigError` naming a field under
      `field` (e.g. 'steps.nas') for a bad block, before any step runs.
    description: one line for listings.
    defaults: optional `defaults()`: a fresh block (a ConfigDict, without `type`) of
      every setting of the kind at the library's default; a step's block then holds
      only overrides of it. None: the block as written is the step's block.
  """

  run: Callable[[StepContext], StepOutput]
  check: Callable[[Any, str], None] | None = None
  description: str = ""
  defaults: Callable[[], Any] | None = None


@dataclasses.dataclass(frozen=True)
class StepSpec:
  """One step of the parsed pipeline (a dataclass: a NamedTuple's `index` is a tuple method).

  Attributes:
    index: 0-based position in `pipeline.order`.
    name: the step's name (its block is `steps.<name>`).
    kind: its `type`, a key of the step registry.
    block: the step's config block.
  """

  index: int
  name: str
  kind: str
  block: Any

  @property
  def dirname(self) -> str:
    """The step directory's name under `WORKDIR/steps/`: `<index>_<name>`."""
    return f"{self.index}_{self.name}"

  @property
  def field(self) -> str:
    """The dotted config field of the step's block, e.g. `steps.nas`."""
    return f"steps.{self.name}"


class StepResult(NamedTuple):
  """A step's recorded result (from its status.json, or from this run).

  Attributes:
    name, kind: as in `StepSpec`.
    status: 'done' | 'failed' | 'skipped'.
    best_metrics: the step's headline metrics ({} unless done).
    output: its hand-off ({} unless done).
    wall_s: seconds of the attempt that finished it (None when skipped).
    error: 'Type: message' of a failed step, else None.
  """

  name: str
  kind: str
  status: str
  best_metrics: Mapping[str, Any]
  output: Mapping[str, Any]
  wall_s: float | None
  error: str | None = None


@dataclasses.dataclass(frozen=True)
class StepContext:
  """What a step's run sees.

  Attributes:
    spec: the step (name, kind, its block).
    workdir: the step's own directory (exists; the step may keep resume state here).
    pipeline_workdir: the pipeline's directory (outputs' relative paths start here).
    config: the whole pipeline config (application-wide blocks such as the task), its
      step blocks effective (`effective_config`).
    previous: the results of every earlier step, in order (all done).
  """

  spec: StepSpec
  workdir: str
  pipeline_workdir: str
  config: Any
  previous: tuple[StepResult, ...]

  @property
  def block(self) -> Any:
    """The step's own config block."""
    return self.spec.block

  def latest(self, key: str, default: Any = _MISSING) -> Any:
    """`output[key]` of the newest earlier step whose output has `key`.

    Raises:
      MissingInputError: no earlier step produced `key` and no default is given.
    """
    for result in reversed(self.previous):
      if key in result.output:
        return result.output[key]
    if default is not _MISSING:
      return default
    made = [r.name for r in self.previous]
    raise MissingInputError(f"step {self.spec.name!r} ({self.spec.kind}) needs {key!r}, which no "
                            f"earlier step produced (earlier steps: {made or 'none'})")

  def relative(self, path: str) -> str:
    """`path` relative to the pipeline workdir (for outputs: the workdir may move)."""
    return os.path.relpath(os.path.abspath(path), os.path.abspath(self.pipeline_workdir))

  def resolve(self, relative_path: str) -> str:
    """An output path (relative to the pipeline workdir) as an absolute path."""
    return os.path.join(os.path.abspath(self.pipeline_workdir), relative_path)


def _order(config) -> list[str]:
  if "pipeline" not in config or "order" not in config.pipeline:
    raise PipelineConfigError("config field pipeline.order: missing (a comma-separated list of "
                              "step names, e.g. 'nas,hpo,fully_train')")
  order = config.pipeline.order
  if isinstance(order, str):
    order = [n.strip() for n in order.split(",") if n.strip()]
  elif isinstance(order, (list, tuple)) and all(isinstance(n, str) for n in order):
    order = [n.strip() for n in order]
  else:
    raise PipelineConfigError(f"config field pipeline.order: expected a comma-separated string of "
                              f"step names, got {order!r}")
  if not order:
    raise PipelineConfigError("config field pipeline.order: no steps")
  for name in order:
    if not _NAME.match(name):
      raise PipelineConfigError(f"config field pipeline.order: step name {name!r} must match "
                                f"{_NAME.pattern} (it names a directory and a config block)")
  repeated = sorted({n for n in order if order.count(n) > 1})
  if repeated:
    raise PipelineConfigError(f"config field pipeline.order: repeated step names {repeated}")
  return order


def _is_block(value) -> bool:
  return hasattr(value, "items") and hasattr(value, "keys")


def apply_overrides(defaults, overrides, field: str, step: str):
  """`defaults` (a block, changed in place) with every value of `overrides` set, recursively.

  Args:
    defaults: a fresh defaults block (a ConfigDict or dict).
    overrides: the values to set; each key must be one of `defaults` at its level.
    field: the dotted config field of `overrides` (e.g. 'steps.nas.study').
    step: the step's name and kind, for messages (e.g. "'nas' (nas)").

  Returns:
    `defaults`, overridden.

  Raises:
    PipelineConfigError: a key the defaults lack (naming the closest valid key), a
      block given for a value or a value for a block, or a value of the wrong type.
  """
  for key, value in overrides.items():
    if key not in defaults:
      error = unknown_key_error(field, key, defaults.keys(), f"setting of step {step}")
      raise PipelineConfigError(str(error))
    if _is_block(defaults[key]):
      if not _is_block(value):
        raise PipelineConfigError(f"config field {field}.{key}: expected a block of settings "
                                  f"({', '.join(defaults[key].keys())}), got {value!r}")
      apply_overrides(defaults[key], value, f"{field}.{key}", step)
      continue
    if _is_block(value):
      raise PipelineConfigError(f"config field {field}.{key}: expected a value, got a block")
    try:
      defaults[key] = value
    except TypeError as e:
      raise PipelineConfigError(f"config field {field}.{key}: {e}") from None
  return defaults


def effective_blocks(config, kinds: Mapping[str, StepKind]) -> dict[str, Any]:
  """`{name: block}` of every block of `config.steps`, listed in the order or not.

  A block whose kind has defaults becomes those defaults with the block's values on
  top (its `type` kept); any other block (no defaults, an unknown kind, no `type`)
  is as written, for `parse_steps` to check when the step is listed.

  Raises:
    PipelineConfigError: a bad override (`apply_overrides`).
  """
  steps = config.steps if "steps" in config else {}
  blocks = {}
  for name, block in steps.items():
    kind_name = block.get("type") if _is_block(block) else None
    kind = kinds.get(kind_name) if isinstance(kind_name, str) else None
    if kind is None or kind.defaults is None:
      blocks[name] = block
      continue
    overrides = {k: v for k, v in block.items() if k != "type"}
    merged = apply_overrides(kind.defaults(), overrides, f"steps.{name}", f"{name!r} ({kind_name})")
    merged["type"] = kind_name
    blocks[name] = merged
  return blocks


def effective_config(config, blocks: Mapping[str, Any]):
  """A copy of `config` whose `steps.<name>` blocks are `blocks` (`effective_blocks`)."""
  config = copy.deepcopy(config)
  for name, block in blocks.items():
    config.steps[name] = block
  return config


def parse_steps(config, kinds: Mapping[str, StepKind],
                blocks: Mapping[str, Any] | None = None) -> tuple[StepSpec, ...]:
  """The ordered steps of `config`, each block checked by its kind.

  Args:
    config: a ConfigDict with `pipeline.order` and a block `steps.<name>` (with a
      `type` field) for every listed name; blocks not listed are ignored.
    kinds: the application's step registry.
    blocks: the effective blocks (default: `effective_blocks(config, kinds)`).

  Returns:
    The steps in order, each with its effective block.

  Raises:
    PipelineConfigError / ConfigError: naming the bad field (`pipeline.order`,
      `steps.<name>`, `steps.<name>.type`, an override the kind's defaults lack, or
      a kind's own field).
  """
  specs = []
  order = _order(config)
  steps = effective_blocks(config, kinds) if blocks is None else blocks
  for index, name in enumerate(order):
    if name not in steps:
      raise PipelineConfigError(f"config field steps.{name}: missing (pipeline.order lists "
                                f"step {name!r}; known blocks: {', '.join(steps) or 'none'})")
    block = steps[name]
    if not hasattr(block, "get") or "type" not in block:
      raise PipelineConfigError(f"config field steps.{name}.type: missing (the step kind; "
                                f"known: {', '.join(kinds)})")
    kind_name = block["type"]
    if not isinstance(kind_name, str):
      raise PipelineConfigError(f"config field steps.{name}.type: expected a string, "
                                f"got {kind_name!r}")
    kind = names.lookup(kinds, kind_name, f"steps.{name}.type", "step kind")
    if kind.check is not None:
      kind.check(block, f"steps.{name}")
    specs.append(StepSpec(index, name, kind_name, block))
  return tuple(specs)
