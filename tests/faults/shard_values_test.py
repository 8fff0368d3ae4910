"""Fault cases of issue #25 item 4 (slow tier): shards with a VALID CRC but wrong values, a
swapped spec.json or mapping.json, and ids outside their field reaching the embedding.

Before: each case trained silently (-7 read the previous field's rows through `vsi.py`, an id
of `rows_f` the next field's, an id past the table was dropped by the device table, a label of
7 trained to a loss of -483, a swapped spec.json or mapping.json was never cross-checked).
After: each stops with one line naming the file (or batch), the row and the field.
"""

import json
import os
import re
import shutil

import numpy as np
import pytest

from experiments.configs import ctr
from sfjax.data import dataset, preprocessed, shards
from sfjax.data.generated import synthetic
from sfjax.embedding import vsi
from sfjax.train import train_and_evaluate

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

HASH_ROWS = 500  # every field's rows
ROWS_PER_SHARD = 300


def _text_config(root, hash_rows=HASH_ROWS):
  d = ctr.get_config().data
  d.format, d.train_path, d.eval_path = "criteo", f"{root}/train.tsv", f"{root}/eval.tsv"
  d.hash_rows, d.shuffle_buffer = hash_rows, 0
  return d


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("criteo")
  gen = synthetic.SyntheticCTR(ctr.get_config("smoke").data.synthetic, seed=0)
  gen.write_criteo(str(root / "train.tsv"), "train", 1000)
  gen.write_criteo(str(root / "eval.tsv"), "eval", 400)
  return root


@pytest.fixture(scope="module")
def pre_dir(text_dir, tmp_path_factory):
  out = tmp_path_factory.mktemp("pre") / "dir"
  preprocessed.preprocess_files(_text_config(text_dir), str(out), rows_per_shard=ROWS_PER_SHARD)
  return out


@pytest.fixture(scope="module")
def other_dir(text_dir, tmp_path_factory):
  """The same text, another hash size: its spec.json and mapping.json are valid, not ours."""
  out = tmp_path_factory.mktemp("other") / "dir"
  preprocessed.preprocess_files(_text_config(text_dir, hash_rows=HASH_ROWS + 1), str(out),
                                rows_per_shard=ROWS_PER_SHARD)
  return out


def _binary_config(root):
  c = ctr.get_config("smoke")
  c.data.format, c.data.train_path, c.data.shuffle_buffer = "preprocessed", str(root), 0
  c.train.steps, c.train.eval_every, c.train.batch_size, c.train.num_devices = 4, 4, 64, 1
  c.train.eval_batch_size = 128
  return c


def _rewrite_with_valid_crc(split_dir, index, array, row, column, value):
  """Sets one value of shard `index`'s `array` and records the new file's size and CRC-32."""
  path = os.path.join(split_dir, shards._shard_file(index, array))
  values = np.array(np.load(path))
  values[(row, column) if values.ndim == 2 else row] = value
  os.remove(path)
  written = shards.save_npy(path, values)
  index_path = os.path.join(split_dir, shards.SPLIT_FILE)
  with open(index_path) as f:
    info = json.load(f)
  info["shards"][index]["files"][array] = written
  with open(index_path, "w") as f:
    json.dump(info, f)
  shards.ShardSplit(split_dir, verify_checksums=False)  # sizes and headers still fine
  return path


CASES = {  # name: (array, row, column, value, field, reason)
    "negative_id": ("ids", 17, 4, -7, "C5", "id -7 outside the field's rows [0, 500)"),
    "id_equal_to_rows": ("ids", 0, 25, HASH_ROWS, "C26",
                         "id 500 outside the field's rows [0, 500)"),
    "id_past_the_table": ("ids", 299, 0, 10**9, "C1",
                          "id 1000000000 outside the field's rows [0, 500)"),
    "label_7": ("labels", 42, 0, 7.0, "label", "label 7.0 is not 0 or 1"),
    "dense_nan": ("dense", 3, 12, np.nan, "dense[12]", "dense value nan is not finite"),
    "dense_inf": ("dense", 250, 0, -np.inf, "dense[0]", "dense value -inf is not finite"),
}


@pytest.mark.parametrize("split", ["train", "eval"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_wrong_value_under_a_valid_crc_is_named(pre_dir, tmp_path, case, split):
  array, row, column, value, field, reason = CASES[case]
  root = tmp_path / "data"
  shutil.copytree(pre_dir, root)
  index = 1 if split == "train" else 0
  path = _rewrite_with_valid_crc(str(root / split), index, array, row, column, value)
  ds = dataset.make_dataset(_binary_config(root).data, seed=0)  # opening reads no values
  with pytest.raises(shards.ShardValueError) as info:
    if split == "train":
      for _ in ds.train_batches(64, seed=0):
        pass
    else:
      list(ds.eval_batches("eval", 64))
  err = info.value
  assert (err.path, err.row, err.field) == (path, row, field)
  assert str(err) == f"{path}: row {row}, field {field!r}: {reason} (preprocess again)"


@pytest.mark.parametrize("backend", ["device", "cache"])
def test_training_on_a_bad_shard_stops_with_the_named_error(pre_dir, tmp_path, backend):
  root = tmp_path / "data"
  shutil.copytree(pre_dir, root)
  path = _rewrite_with_valid_crc(str(root / "train"), 0, "labels", 5, 0, 7.0)
  config = _binary_config(root)
  config.embedding.backend = backend
  with pytest.raises(shards.ShardValueError, match="row 5, field 'label': label 7.0") as info:
    train_and_evaluate(config)
  assert info.value.path == path


@pytest.mark.parametrize("swapped", ["spec.json", "mapping.json"])
def test_a_swapped_spec_or_mapping_is_refused_naming_it(pre_dir, other_dir, tmp_path, swapped):
  root = tmp_path / "data"
  shutil.copytree(pre_dir, root)
  shutil.copyfile(other_dir / swapped, root / swapped)
  with pytest.raises(shards.CorruptShardError, match="does not belong to") as info:
    train_and_evaluate(_binary_config(root))
  assert info.value.path == str(root / swapped) and "\n" not in str(info.value)


class _OneBadId:
  """A custom data set: the preprocessed one with a single id replaced in training batch 2."""

  def __init__(self, inner, row, column, value):
    self._inner, self._where, self._value = inner, (row, column), value
    self.spec, self.eval_splits, self.oracle = inner.spec, inner.eval_splits, None

  @property
  def stats(self):
    return self._inner.stats

  def train_batches(self, batch_size, seed):
    for step, batch in enumerate(self._inner.train_batches(batch_size, seed)):
      if step == 2:
        batch.ids[self._where] = self._value
      yield batch

  def eval_batches(self, split, batch_size):
    return self._inner.eval_batches(split, batch_size)


@pytest.mark.parametrize("backend", ["device", "cache"])
@pytest.mark.parametrize("value,column,shown", [
    (-7, 3, "field 3: id -7 outside the field's rows [0, 500)"),  # once: field 2's row 493
    (HASH_ROWS, 3, "field 3: id 500 outside the field's rows [0, 500)"),  # once: field 4's row 0
    (HASH_ROWS, 25, "field 25: id 500 outside the field's rows [0, 500)"),  # once: dropped
])
def test_an_id_outside_its_field_from_a_custom_dataset_is_never_trained(
    pre_dir, backend, value, column, shown):
  config = _binary_config(pre_dir)
  config.embedding.backend = backend
  ds = _OneBadId(dataset.make_dataset(config.data, seed=0), 9, column, value)
  with pytest.raises(vsi.IdRangeError, match=re.escape(f"batch row 9, {shown}")):
    train_and_evaluate(config, dataset=ds)
