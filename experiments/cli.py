"""The command line every benchmark shares: `--config=experiments/configs/bench_X.py[:smoke]`.

A benchmark module defines no flag when imported (so every module of experiments/
imports into one process, a notebook or a test) and exposes `run(config) -> dict`;
its `if __name__ == "__main__":` block calls `run_benchmark`, which defines `--config`
(plus the `--config.<field>=...` overrides), parses the command line, calls `run`,
prints the benchmark's human-readable lines and ends stdout with the result as one
JSON line (also written to `config.out` when set).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import ml_collections
from absl import app
from ml_collections import config_flags

from experiments import report
from sfjax.core import ConfigError

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
    try:
      result = run(config)
    except ConfigError as err:
      raise app.UsageError(str(err)) from err
    if summarize is not None:
      summarize(result)
    report.emit_json_line(result, config.get("out", ""))

  app.run(main)
