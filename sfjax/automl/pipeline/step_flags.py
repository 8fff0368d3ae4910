"""Command-line overrides of step settings: `--config.steps.<name>.<dotted key>=<value>`.

A step block holds only overrides of its kind's defaults (`StepKind.defaults`), so
most settings are absent from a config file, and ml_collections' config flags
override only the fields a config holds. A pipeline CLI therefore takes these
flags out of argv before its flags are parsed (`take_step_flags`) and sets them on
the loaded config (`set_step_flags`), each value typed like the kind's default at
that key (else like the block's own value). They are then overrides like any
other: the engine checks every key against the kind's defaults, and a misspelt one
is an error naming the step and the closest valid key.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence
from typing import Any

from sfjax.automl.pipeline.step_specs import PipelineConfigError, StepKind

_ABSENT = object()
_TRUE, _FALSE = ("true", "True", "1"), ("false", "False", "0")


def take_step_flags(argv: Sequence[str], flag: str = "config"
                    ) -> tuple[list[str], list[tuple[str, str]]]:
  """Splits the `--<flag>.steps.<path>=<value>` flags (and `--<flag>.steps.<path> <value>`,
  `--[no]<flag>.steps.<path>` for a boolean) out of `argv`.

  Returns:
    (the other arguments, in order; [(path under `steps`, value text)], in order).
  """
  pattern = re.compile(rf"^--?(no)?{re.escape(flag)}\.steps\.([\w.]+)(=(.*))?$", re.DOTALL)
  rest, taken = [], []
  i = 0
  while i < len(argv):
    match = pattern.match(argv[i])
    if match is None:
      rest.append(argv[i])
    elif match.group(3) is not None:
      taken.append((match.group(2), match.group(4)))
    elif match.group(1):
      taken.append((match.group(2), "false"))
    elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
      taken.append((match.group(2), argv[i + 1]))
      i += 1
    else:
      taken.append((match.group(2), "true"))
    i += 1
  return rest, taken


def _lookup(block, keys: Sequence[str]) -> Any:
  for key in keys:
    if not hasattr(block, "keys") or key not in block:
      return _ABSENT
    block = block[key]
  return block


def _literal(text: str) -> Any:
  """A Python literal, else the text itself (ml_collections' rule for untyped fields)."""
  try:
    return ast.literal_eval(text.capitalize() if text in ("true", "false") else text)
  except (SyntaxError, ValueError):
    return text


def _parse_value(text: str, like: Any, field: str) -> Any:
  """`text` as a value of the type of `like`; a literal (else the text) when `like` is
  absent or None.

  Raises:
    PipelineConfigError: naming `field`, for text that is not of that type.
  """
  if like is _ABSENT or like is None:
    return _literal(text)
  try:
    if isinstance(like, bool):
      if text not in _TRUE + _FALSE:
        raise ValueError(text)
      return text in _TRUE
    if isinstance(like, int):
      return int(text)
    if isinstance(like, float):
      return float(text)
    if isinstance(like, (tuple, list)):
      value = ast.literal_eval(text)
      return tuple(value) if isinstance(value, (tuple, list)) else (value,)
  except (SyntaxError, ValueError):
    raise PipelineConfigError(f"config field {field}: expected {type(like).__name__}, got "
                              f"{text!r}") from None
  return text if isinstance(like, str) else _literal(text)


def set_step_flags(config, flags: Sequence[tuple[str, str]],
                   kinds: Mapping[str, StepKind]) -> None:
  """Sets each `(path, text)` of `take_step_flags` in `config.steps` (an unlocked config).

  Missing sub-blocks are created (of the block's own type). The value is typed like the
  kind's default at the path, else like the block's current value.

  Raises:
    PipelineConfigError: the step has no block, the path names no setting, or the text
      does not parse as the setting's type.
  """
  steps = config.steps if "steps" in config else {}
  for path, text in flags:
    name, *keys = path.split(".")
    field = f"steps.{path}"
    if name not in steps:
      raise PipelineConfigError(f"config field steps.{name}: missing (a flag sets {field}; "
                                f"known blocks: {', '.join(steps) or 'none'})")
    if not keys:
      raise PipelineConfigError(f"config field {field}: a flag sets one setting of a step, "
                                f"e.g. --config.{field}.<key>=<value>")
    block = steps[name]
    kind = kinds.get(block.get("type")) if isinstance(block.get("type"), str) else None
    like = _lookup(kind.defaults(), keys) if kind is not None and kind.defaults else _ABSENT
    if like is _ABSENT:
      like = _lookup(block, keys)
    value = _parse_value(text, like, field)
    for key in keys[:-1]:
      if key not in block:
        block[key] = type(block)()
      block = block[key]
    block[keys[-1]] = value
