"""Setting a data set's tables from the config (`data.tables`, issue #22).

A feature layout declares its tables (`feature_layout.TableSpec`: rows, and optionally
its own row optimizer, learning rate, initializer and embedding dim). The readers build
the tables from the data (MovieLens, Parquet, the multi-hot generator); `data.tables`
sets each table's own settings on top:

  data.tables = "item:dim=8,optimizer=adagrad,learning_rate=0.05; user:dim=4"

Entries are separated by ';', settings by ','. Keys: `optimizer` (a row optimizer
name), `learning_rate`, `init_stddev` (> 0) and `dim` (1..model.embed_dim). A table not
named keeps the `embedding` block's settings. `RetabledFeatures` wraps any data set with
a feature layout and replaces its tables' settings; ids, weights, labels, dense features
and the oracle are the wrapped data set's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sfjax.core.entries import named_entries
from sfjax.core.errors import ConfigError
from sfjax.data import feature_select
from sfjax.data.types import DatasetSpec

_FIELD = "data.tables"
_KEYS = {"optimizer": str, "learning_rate": float, "init_stddev": float, "dim": int}


def parse_table_settings(text: str) -> dict[str, dict[str, Any]]:
  """`'item:dim=8,optimizer=adagrad; user:dim=4'` -> {'item': {'dim': 8, 'optimizer':
  'adagrad'}, 'user': {'dim': 4}}; '' -> {}.

  Raises:
    ConfigError: naming `data.tables`, for an entry that is not `table:key=value,...`, an
      unknown key, a value of the wrong type, or a table or key named twice.
  """
  out: dict[str, dict[str, Any]] = {}
  for name, rest in named_entries(text, _FIELD, form="table:key=value,...", kind="table",
                                  separator=";"):
    settings: dict[str, Any] = {}
    for item in (i.strip() for i in rest.split(",")):
      key, eq, value = (p.strip() for p in item.partition("="))
      if not eq or key not in _KEYS:
        raise ConfigError(f"config field {_FIELD}: {name}: {item!r} is not key=value with a "
                          f"key among {', '.join(_KEYS)}")
      if key in settings:
        raise ConfigError(f"config field {_FIELD}: {name}: {key} is set twice")
      try:
        settings[key] = _KEYS[key](value)
      except ValueError:
        raise ConfigError(f"config field {_FIELD}: {name}.{key}: {value!r} is not "
                          f"{'an integer' if _KEYS[key] is int else 'a number'}") from None
    out[name] = settings
  return out


def format_table_settings(settings: dict[str, dict[str, Any]]) -> str:
  """The `data.tables` text of `settings` (`parse_table_settings`'s inverse, tables and
  keys in the order given): {'item': {'dim': 8}, 'user': {'dim': 4}} -> 'item:dim=8; user:dim=4'."""
  return "; ".join(f"{name}:" + ",".join(f"{k}={v}" for k, v in keys.items())
                   for name, keys in settings.items() if keys)


def with_table_settings(spec: DatasetSpec, settings: dict[str, dict[str, Any]]) -> DatasetSpec:
  """`spec` whose named tables take `settings` (checked as any `TableSpec`: a bad value
  names `features.tables.<name>.<key>`).

  Raises:
    ConfigError: naming `data.tables`, for a name that is not a table of the data set
      (or a data set without a feature layout).
  """
  if not settings:
    return spec
  layout = spec.layout
  tables = [] if layout is None else [t.name for t in layout.tables]
  for name in settings:
    if name not in tables:
      raise ConfigError(f"config field {_FIELD}: {name!r} is not a table of the data set "
                        f"(its tables: {', '.join(tables) or 'none: it has no feature layout'})")
  assert layout is not None  # tables exist only in a layout (checked above)
  new = tuple(dataclasses.replace(t, **settings.get(t.name, {})) for t in layout.tables)
  return dataclasses.replace(spec, layout=dataclasses.replace(layout, tables=new))


class RetabledFeatures(feature_select.DatasetView):
  """A data set whose tables take the settings of `data.tables` (see the module
  docstring); its batches are the wrapped set's.

  Args:
    dataset: any `CTRDataset` with a feature layout.
    settings: `parse_table_settings`'s result.
  """

  def __init__(self, dataset, settings: dict[str, dict[str, Any]]):
    super().__init__(dataset)
    self.spec = with_table_settings(dataset.spec, settings)


def with_tables(dataset, text: str):
  """`dataset` itself when `text` is '', else `RetabledFeatures` with its settings."""
  settings = parse_table_settings(text)
  return dataset if not settings else RetabledFeatures(dataset, settings)
