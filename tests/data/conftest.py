"""Shared fixtures of the data tests: writing small input files, a small synthetic set."""

import gzip

import pytest

from experiments.configs import ctr
from sfjax.data.generated import synthetic


def _write_file(path, content, gz=False):
  """Writes `content` (a str, or an iterable of lines) to `path` (gzipped if `gz`); returns str(path)."""
  text = content if isinstance(content, str) else "".join(content)
  data = text.encode()
  if gz:
    with gzip.open(path, "wb") as f:
      f.write(data)
  else:
    path.write_bytes(data)
  return str(path)


@pytest.fixture
def write_file():
  """`write_file(path, content, gz=False) -> str`: a tiny input file for a reader test."""
  return _write_file


def _small_config(**overrides):
  cfg = ctr.get_config().data.synthetic
  cfg.num_train, cfg.num_eval = 3000, 20000
  for key, value in overrides.items():
    setattr(cfg, key, value)
  return cfg


@pytest.fixture
def small_config():
  """`small_config(**overrides)`: the default synthetic config with 3000 train / 20000 eval rows."""
  return _small_config


@pytest.fixture(scope="session")
def data():
  """A small synthetic data set (seed 0), shared read-only by the tests."""
  return synthetic.SyntheticCTR(_small_config(), seed=0)
