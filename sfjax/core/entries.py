"""Config strings of named entries: `'name:value, name:value'` parsed one way everywhere.

`data.pooling = "tags:mean,long0:sqrtn"`, `data.tables = "item:dim=8; user:dim=4"` and a
search's `space.table_dims = "item:4|8,user:2"` are lists of `name:rest` entries; each
parser reads its `rest` its own way and leaves the list to `named_entries`.
"""

from __future__ import annotations

from sfjax.core.errors import ConfigError


def named_entries(text: str, field: str, *, form: str, kind: str,
                  separator: str = ",") -> list[tuple[str, str]]:
  """`(name, rest)` of each `name:rest` entry of `text`, in order (blank entries skipped,
  both parts stripped).

  Args:
    text: the config string.
    field: the dotted config field, for messages (e.g. 'data.pooling').
    form: an entry's form, for messages (e.g. 'feature:pooling').
    kind: what a name names, for messages (e.g. 'feature').
    separator: between entries.

  Raises:
    ConfigError: "config field <field>: entry '...' is not '<form>'" for an entry without a
      name or a rest, or "...: <kind> 'x' is named twice".
  """
  out: list[tuple[str, str]] = []
  for entry in (e.strip() for e in str(text).split(separator)):
    if not entry:
      continue
    name, sep, rest = (p.strip() for p in entry.partition(":"))
    if not sep or not name or not rest:
      raise ConfigError(f"config field {field}: entry {entry!r} is not '{form}'")
    if any(name == seen for seen, _ in out):
      raise ConfigError(f"config field {field}: {kind} {name!r} is named twice")
    out.append((name, rest))
  return out
