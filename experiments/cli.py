"""The command line every entry point shares: one-line errors, and the benchmarks' `--config`.

Errors (issue #25, item 6): `run_main(main)` runs an absl `main` so that any failure
prints ONE line `error: ...` to stderr, exit status 2 for a usage or config error (a
bad flag or config value, an unknown config key with the closest known one, a missing
path or a directory where a file is expected) and 1 for a runtime error; the traceback
only with `--verbose`. `main_with_errors(main)` wraps just the main function and
`parse_flags_with_errors` just the flag parsing, for entry points that call `app.run`
themselves.

Benchmarks: `--config=experiments/configs/bench_X.py[:smoke]`.

A benchmark module defines no flag when imported (so every module of experiments/
imports into one process, a notebook or a test) and exposes `run(config) -> dict`;
its `if __name__ == "__main__":` block calls `run_benchmark`, which defines `--config`
(plus the `--config.<field>=...` overrides), parses the command line, calls `run`,
prints the benchmark's human-readable lines and ends stdout with the result as one
JSON line (also written to `config.out` when set).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import ml_collections
from absl import app, flags
from ml_collections import config_flags

from experiments import report
from sfjax.core import ConfigError, WorkdirLockedError, guard_launch_threads, unknown_key_error

# Errors that mean "the command line or config is wrong" (exit 2; a workdir in use too: use
# another); everything else is a runtime error (exit 1). An entry point may add its own
# (`main_with_errors(usage=...)`).
USAGE_ERRORS: tuple[type[BaseException], ...] = (
    ConfigError, app.UsageError, flags.Error, FileNotFoundError, IsADirectoryError,
    NotADirectoryError, WorkdirLockedError)
_OVERRIDE = re.compile(r"^--?config\.([\w.]+)=")


def one_line(error: BaseException | str) -> str:
  """`error` as one line: a multi-line message keeps its first and last lines (a config
  file's traceback ends with the exception that matters)."""
  text = str(error) if isinstance(error, str) else (str(error) or type(error).__name__)
  if isinstance(error, KeyError) and error.args:
    text = str(error.args[0])  # str(KeyError) is the repr of its message
  lines = [line.strip() for line in text.splitlines() if line.strip()]
  if not lines:
    return type(error).__name__
  return lines[0] if len(lines) == 1 else f"{lines[0]} {lines[-1]}"


def _print_error(message: str) -> None:
  sys.stderr.write(f"error: {message}\n")
  sys.stderr.flush()


def _verbose() -> bool:
  return "verbose" in flags.FLAGS and flags.FLAGS["verbose"].present and flags.FLAGS.verbose


def exit_code(error: BaseException, usage: tuple[type[BaseException], ...] = ()) -> int:
  """2 for a usage or config error (`USAGE_ERRORS` + `usage`), 1 for any other."""
  return 2 if isinstance(error, USAGE_ERRORS + tuple(usage)) else 1


def main_with_errors(main: Callable[[list[str]], Any],
                     usage: Sequence[type[BaseException]] = ()) -> Callable[[list[str]], Any]:
  """`main` that prints one `error:` line and exits 2 (usage/config) or 1 (runtime) on a
  failure, with the traceback first when `--verbose` is given. Before it runs, fake CPU
  devices asked for in `XLA_FLAGS` get enough XLA launch threads (`guard_launch_threads`).

  Args:
    main: an absl main, `main(argv)`.
    usage: more exception types that count as usage errors (exit 2).
  """

  @functools.wraps(main)
  def wrapped(argv):
    guard_launch_threads()  # fake CPU devices in XLA_FLAGS: enough launch threads (no hang)
    try:
      return main(argv)
    except KeyboardInterrupt:
      _print_error("interrupted")
      sys.exit(130)
    except Exception as err:  # pylint: disable=broad-except  (the one place errors are shown)
      if _verbose():
        traceback.print_exc()
      _print_error(one_line(err))
      sys.exit(exit_code(err, tuple(usage)))

  return wrapped


def _load_config(value: str) -> ml_collections.ConfigDict | None:
  """The config `--config=PATH[:ARG]` names, without overrides (None if it does not load)."""
  path, _, arg = value.partition(":")
  try:
    spec = importlib.util.spec_from_file_location("_sfjax_cli_config", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.get_config(arg) if arg else module.get_config()
  except Exception:  # pylint: disable=broad-except  (the caller reports the parse error)
    return None


def unknown_override(argv: Sequence[str]) -> ConfigError | None:
  """The error for the first `--config.<a.b.c>=...` of `argv` that names no field of the
  `--config` file's config, suggesting the closest key (None if every one exists)."""
  value = next((a.split("=", 1)[1] for a in argv if a.startswith(("--config=", "-config="))), None)
  config = _load_config(value) if value else None
  if config is None:
    return None
  for arg in argv:
    m = _OVERRIDE.match(arg)
    if not m:
      continue
    node, done = config, []
    for key in m.group(1).split("."):
      if not isinstance(node, (ml_collections.ConfigDict, dict)):
        break
      if key not in node:
        return unknown_key_error(".".join(done), key, node.keys())
      node, done = node[key], [*done, key]
  return None


def _config_file_error(argv: Sequence[str]) -> str | None:
  """A `--config` value that is a directory or a missing file, said so."""
  for arg in argv:
    if arg.startswith(("--config=", "-config=")):
      path = arg.split("=", 1)[1].partition(":")[0]
      if os.path.isdir(path):
        return f"--config={path}: a directory, not a config file (a .py file with get_config)"
      if not os.path.exists(path):
        return f"--config={path}: no such file"
  return None


def parse_flags_with_errors(argv: list[str]) -> list[str]:
  """absl's flag parsing (`app.run(..., flags_parser=...)`) with one-line errors, exit 2: an
  unknown config key names the closest known one, a bad value names the flag, a config
  path that is a directory or missing says so. Defines `--verbose` if it is not defined."""
  if "verbose" not in flags.FLAGS:
    flags.DEFINE_boolean("verbose", False, "On an error, print the traceback too.")
  problem = _config_file_error(argv[1:])
  if problem:
    _print_error(problem)
    sys.exit(2)
  try:
    return flags.FLAGS(argv)
  except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as err:
    if "--verbose" in argv:
      traceback.print_exc()
    _print_error(one_line(unknown_override(argv[1:]) or err))
    sys.exit(2)


def run_main(main: Callable[[list[str]], Any], argv: list[str] | None = None,
             usage: Sequence[type[BaseException]] = ()) -> None:
  """`app.run(main)` with one-line errors (`parse_flags_with_errors`, `main_with_errors`)."""
  app.run(main_with_errors(main, usage), argv=argv, flags_parser=parse_flags_with_errors)

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


def config_path(name: str) -> str:
  """The config file of benchmark `name` (e.g. 'bench_train'), an absolute path."""
  return os.path.join(CONFIGS, f"{name}.py")


def split_names(value: str, field: str, known) -> list[str]:
  """The names of a comma-separated config field, each checked against `known`.

  Raises:
    ConfigError: naming `field` and the unknown names.
  """
  names = [v.strip() for v in value.split(",") if v.strip()]
  unknown = [n for n in names if n not in known]
  if unknown:
    raise ConfigError(f"config field {field}: unknown {unknown} (known: {', '.join(known)})")
  return names


def in_workdir(workdir: str, prefix: str, fn: Callable[[str], Any]) -> Any:
  """`fn(root)` with `root` = `workdir` (made if missing, kept), or, when `workdir` is empty,
  a new temporary folder named `prefix...`, removed afterwards whatever happens."""
  root = workdir or tempfile.mkdtemp(prefix=prefix)
  os.makedirs(root, exist_ok=True)
  try:
    return fn(root)
  finally:
    if not workdir:
      shutil.rmtree(root, ignore_errors=True)


def run_benchmark(name: str, run: Callable[[ml_collections.ConfigDict], dict],
                  summarize: Callable[[dict], None] | None = None) -> None:
  """Runs benchmark `name` from the command line (call it under `__main__` only).

  Args:
    name: the module's name, e.g. 'bench_cache'; `--config` defaults to
      `experiments/configs/<name>.py`.
    run: the benchmark, `run(config) -> dict` of its figures.
    summarize: prints the human-readable table of a result (to stderr), if any.
  """
  config_flag = config_flags.DEFINE_config_file(
      "config", config_path(name), f"The benchmark's config (experiments/configs/{name}.py"
      "[:smoke]); override fields with --config.<field>=...", lock_config=True)

  def main(argv):
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = config_flag.value
    result = run(config)
    if summarize is not None:
      summarize(result)
    report.emit_json_line(result, config.get("out", ""))

  run_main(main)
