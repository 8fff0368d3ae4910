"""Names of registered choices: one lookup, one error for an unknown name.

Every set of named choices (data formats, backends, models, optimizers, search
algorithms) is a dict in the module that builds them; config validation, search
spaces and flags derive their name lists from those dicts, and look names up here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from sfjax.core.errors import ConfigError

V = TypeVar("V")


def lookup(registry: Mapping[str, V], name: str, field: str, what: str) -> V:
  """`registry[name]`, or a ConfigError naming the config field and the known names.

  Args:
    registry: name -> entry.
    name: the name asked for.
    field: the dotted config field that gave the name (e.g. 'embedding.optimizer').
    what: what the entries are, for the message (e.g. 'row optimizer').

  Raises:
    ConfigError: "config field <field>: unknown <what> <name> (known: ...)".
  """
  if name not in registry:
    raise ConfigError(f"config field {field}: unknown {what} {name!r} "
                      f"(known: {', '.join(registry)})")
  return registry[name]
