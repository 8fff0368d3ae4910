"""experiments/cli.py: every module of experiments/ imports into one process, every benchmark
has a config with a smoke variant and `run(config)`, and the one command-line smoke run."""

import importlib
import json
import os
import pathlib
import subprocess
import sys

import pytest
from absl import flags

from experiments import cli
from sfjax.core.errors import ConfigError

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULES = sorted(p.stem for p in (ROOT / "experiments").glob("*.py") if p.stem != "__init__")
BENCHES = [m for m in MODULES if m.startswith("bench_")]


def test_every_experiments_module_imports_into_one_process():
  # Two modules defining the same absl flag at import (e.g. `--config`) raise
  # DuplicateFlagError here; none may define a flag at import at all.
  assert {"train_ctr", "search", "pipeline", "export", "preprocess", "plot"} <= set(MODULES)
  for name in MODULES:
    importlib.import_module(f"experiments.{name}")
  # The entry points' flags exist only once a module runs as __main__ (no library or test
  # module defines absl flags).
  defined = {"config", "workdir", "out", "checkpoint", "overwrite", "rows_per_shard"} & set(flags.FLAGS)
  assert not defined, f"flags defined at import: {sorted(defined)}"


_BENCHES_BORN_WITH_CONFIGS = {"bench_serving", "bench_bag_layout", "bench_sequences", "bench_ablation",
                              "bench_growth", "bench_text_input", "bench_host_cohort",
                              "bench_table_widths", "bench_compress"}


@pytest.mark.parametrize("name", BENCHES)
def test_every_benchmark_has_a_config_with_a_smoke_variant_and_run(name):
  module = importlib.import_module(f"experiments.{name}")
  assert callable(module.run)
  config_module = importlib.import_module(f"experiments.configs.{name}")
  assert f"python -m experiments.{name} --config=experiments/configs/{name}.py" in (
      config_module.__doc__)
  # Benchmarks that had flags before the configs say where each went; newer ones have none.
  assert ("Old flag -> config field" in module.__doc__) != (name in _BENCHES_BORN_WITH_CONFIGS)
  default, smoke = config_module.get_config(), config_module.get_config("smoke")
  assert set(default) == set(smoke) and "out" in default and default.out == ""
  assert default != smoke
  with pytest.raises(ValueError, match="unknown config variant 'huge'"):
    config_module.get_config("huge")


def test_split_names():
  assert cli.split_names("a, b,,c", "f", ("a", "b", "c")) == ["a", "b", "c"]
  assert cli.split_names("", "f", ("a",)) == []
  with pytest.raises(ConfigError, match=r"config field f: unknown \['d'\] \(known: a, b\)"):
    cli.split_names("a,d", "f", ("a", "b"))


def test_command_line_prints_the_json_last_and_names_a_bad_field(tmp_path):
  # The one command-line smoke run: flags -> config -> run -> table + JSON last line + file.
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  out = tmp_path / "cache.json"
  command = [sys.executable, "-m", "experiments.bench_cache",
             "--config=experiments/configs/bench_cache.py:smoke", "--config.timing_steps=0"]
  r = subprocess.run([*command, "--config.zipf=1.2", f"--config.out={out}"], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=240)
  assert r.returncode == 0, r.stderr[-3000:]
  final = json.loads(r.stdout.strip().splitlines()[-1])
  assert final == json.loads(out.read_text())
  assert final["benchmark"] == "bench_cache" and [b["zipf"] for b in final["baselines"]] == [1.2]
  assert "belady" in r.stderr  # the table
  bad = subprocess.run([*command, "--config.policies=lru,fifo"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=240)
  assert bad.returncode != 0 and "config field policies: unknown ['fifo']" in bad.stderr
  assert not bad.stdout.strip()


def _exit_of(main, argv=("prog",)):
  with pytest.raises(SystemExit) as info:
    cli.main_with_errors(main, usage=(LookupError,))(list(argv))
  return info.value.code


@pytest.mark.parametrize("error,code", [
    (ConfigError("config field a.b: must be > 0"), 2), (FileNotFoundError("x: missing"), 2),
    (IsADirectoryError("d: is a directory"), 2), (KeyError("k"), 2),  # LookupError: given usage
    (RuntimeError("node lost"), 1), (OSError("disk full"), 1), (FloatingPointError("nan"), 1)])
def test_main_with_errors_prints_one_line_and_the_exit_status(error, code, capsys):
  def main(argv):
    raise error

  assert _exit_of(main) == code
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err
  assert cli.one_line(error) in err


def test_main_with_errors_passes_results_and_interrupts():
  assert cli.main_with_errors(lambda argv: argv[1:])(["p", "a"]) == ["a"]

  def interrupted(argv):
    raise KeyboardInterrupt

  assert _exit_of(interrupted) == 130


def test_one_line_keeps_the_first_and_last_lines():
  assert cli.one_line(ValueError("flag --config: Error\n\nTraceback:\n  x\nValueError: bad")) == (
      "flag --config: Error ValueError: bad")
  assert cli.one_line(KeyError("'k'\nDid you mean")) == "'k' Did you mean"
  assert cli.one_line(RuntimeError()) == "RuntimeError"


def test_an_unknown_override_names_the_closest_key_and_a_config_dir_says_so(tmp_path):
  ctr_config = "--config=experiments/configs/ctr.py:smoke"
  err = cli.unknown_override([ctr_config, "--config.train.stepz=3"])
  assert str(err).startswith("config field train.stepz: unknown key; did you mean train.steps?")
  err = cli.unknown_override([ctr_config, "--config.trian.steps=3"])
  assert str(err).startswith("config field trian: unknown key; did you mean train?")
  assert cli.unknown_override([ctr_config, "--config.train.steps=3"]) is None
  assert cli.unknown_override(["--config=no/such.py", "--config.a=1"]) is None
  assert cli._config_file_error(["--config=experiments/configs"]) == (
      "--config=experiments/configs: a directory, not a config file (a .py file with get_config)")
  assert cli._config_file_error([f"--config={tmp_path}/none.py:smoke"]) == (
      f"--config={tmp_path}/none.py: no such file")
  assert cli._config_file_error([ctr_config]) is None


def test_in_workdir_keeps_a_given_folder_and_removes_a_temporary_one_even_on_error(tmp_path):
  given = tmp_path / "made" / "here"
  assert cli.in_workdir(str(given), "x_", lambda root: root) == str(given) and given.is_dir()
  seen = []

  def fail(root):
    seen.append(root)
    assert os.path.isdir(root) and os.path.basename(root).startswith("bench_x_")
    raise RuntimeError("boom")

  with pytest.raises(RuntimeError, match="boom"):
    cli.in_workdir("", "bench_x_", fail)
  assert seen and not os.path.exists(seen[0])
