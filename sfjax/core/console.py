"""What a run prints: our progress lines, not the libraries' INFO chatter.

`set_up_console(verbosity)` is the one call an entry point makes (first thing in `main`). It
sets absl's verbosity (which, under `absl.app`, is the root logger's level) and then
lowers the libraries that would otherwise fill the console at INFO:

* orbax logs ~30 INFO lines per checkpoint through `absl.logging`, so its records come
  from the 'absl' logger like ours; a filter on that logger drops those below WARNING
  whose source file lies inside a quiet package (`_QUIET_PACKAGES`).
* jax's `xla_bridge` logs "Unable to initialize backend 'tpu': ... libtpu.so ..." at
  INFO on every start where libtpu is missing; its Python logger (and orbax's own, if a
  version uses one) is set to WARNING (`_QUIET_LOGGERS`).

Warnings and errors of every library still show. Not reachable from Python: gloo's
"[Gloo] Rank i is connected to ..." lines in multi-process CPU runs, written to stdout
by its C++ runtime (inside jaxlib) with no switch.
"""

from __future__ import annotations

import logging
import pathlib

from absl import logging as absl_logging

# Python loggers kept at WARNING and above.
_QUIET_LOGGERS = ("jax._src.xla_bridge", "orbax")
# Packages whose `absl.logging` calls below WARNING are dropped (matched on the source path).
_QUIET_PACKAGES = ("orbax",)


class _LibraryInfoFilter(logging.Filter):
  """Drops records below WARNING logged from a source file inside one of `packages`.

  Attributes:
    packages: directory names (e.g. 'orbax'); a record whose `pathname` has one of them
      as a path component is a library record.
  """

  def __init__(self, packages: tuple[str, ...] = _QUIET_PACKAGES):
    super().__init__()
    self.packages = frozenset(packages)

  def filter(self, record: logging.LogRecord) -> bool:
    """True to keep `record`: WARNING and above always, else only outside `packages`."""
    if record.levelno >= logging.WARNING:
      return True
    return self.packages.isdisjoint(pathlib.PurePath(record.pathname).parts)


def set_up_console(verbosity: int = absl_logging.INFO) -> None:
  """Sets absl's `verbosity` and quiets the libraries' INFO records (see the module doc).

  Idempotent: a second call adds no second filter.

  Args:
    verbosity: an absl level (`absl.logging.INFO`, `WARNING`, ...) for our own lines.
  """
  absl_logging.set_verbosity(verbosity)
  for name in _QUIET_LOGGERS:
    logging.getLogger(name).setLevel(logging.WARNING)
  absl_logger = absl_logging.get_absl_logger()
  if not any(isinstance(f, _LibraryInfoFilter) for f in absl_logger.filters):
    absl_logger.addFilter(_LibraryInfoFilter())
