"""Raw records map as training mapped them: the key rule, hashing, vocabulary, Criteo and
Avazu lines and dicts; bad records fail naming the record and the field."""

import numpy as np
import pytest

from experiments.configs import ctr
from sfjax.data import SyntheticCTR, avazu
from sfjax.data import dataset as dataset_lib
from sfjax.serving.bundle import feature_mapping
from sfjax.serving.features import (
  Features,
  RecordError,
  RecordParser,
  concat_features,
)


def _parser(data, config, tmp_path):
  """A RecordParser with the mapping the bundle writer records for `config`."""
  spec = data.spec
  record_format, mapping = feature_mapping(config, list(spec.field_rows), str(tmp_path),
                                           lambda: data)
  manifest = {"record_format": record_format, "mapping": mapping,
              "features": [{"name": f.name} for f in spec.fields],
              "dense": {"names": [f"I{i}" for i in range(1, 14)] if record_format == "criteo"
                        else []}}
  return RecordParser(manifest, str(tmp_path))


@pytest.mark.parametrize("hash_rows", [97, 0])  # hashing; a vocabulary (min_count 2)
def test_criteo_lines_and_dicts_map_as_training(hash_rows, tmp_path):
  c = ctr.get_config("smoke")
  gen = SyntheticCTR(c.data.synthetic, seed=0)
  gen.write_criteo(f"{tmp_path}/train.tsv", "train", 1_000)
  gen.write_criteo(f"{tmp_path}/eval.tsv", "eval", 200)
  c.data.format, c.data.hash_rows, c.data.min_count = "criteo", hash_rows, 2
  c.data.train_path, c.data.eval_path = f"{tmp_path}/train.tsv", f"{tmp_path}/eval.tsv"
  data = dataset_lib.make_dataset(c.data, c.seed)
  parser = _parser(data, c, tmp_path)
  want = next(iter(data.chunks("eval")))
  with open(f"{tmp_path}/eval.tsv") as f:
    lines = [line.rstrip("\n") for line in f]
  got = parser(lines)
  np.testing.assert_array_equal(got.ids, want.ids)
  np.testing.assert_array_equal(got.dense, want.dense)
  if hash_rows == 0:  # some values are rare: they map to the OOV row 0, as in training
    assert (want.ids == 0).any() and (want.ids > 0).any()
  names = [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]
  dicts = [dict(zip(names, line.split("\t")[1:], strict=True)) for line in lines[:20]]
  dicts[0] = dicts[0] | {"I1": int(dicts[0]["I1"] or 0)}  # ints are accepted for I fields
  mixed = parser(dicts[:10] + lines[10:20])
  np.testing.assert_array_equal(mixed.ids, want.ids[:20])
  np.testing.assert_array_equal(mixed.dense, want.dense[:20])
  merged = concat_features([mixed, Features(want.ids[:3], want.dense[:3])])
  assert merged.ids.shape == (23, 26) and merged.dense.shape == (23, 13)
  assert merged.weights is None  # one-hot features carry no weights
  with pytest.raises(RecordError, match=r"record 1: bad criteo line: expected 40 tab"):
    parser([lines[0], "1\t2\t3"])
  with pytest.raises(RecordError, match="record 0: feature 'I3' has the wrong type float"):
    parser([dicts[0] | {"I3": 1.5}])
  with pytest.raises(RecordError, match="record 0: feature 'I3' is not an integer"):
    parser([dicts[0] | {"I3": "abc"}])
  with pytest.raises(RecordError, match="record 2: missing feature 'C26'"):
    parser(dicts[:2] + [{k: v for k, v in dicts[2].items() if k != "C26"}])


def test_avazu_lines_and_dicts_map_as_training(tmp_path):
  header = "id,click,hour," + ",".join(avazu.CATEGORICAL_COLUMNS)
  rows = [["1", "0", "14102100"] + [f"v{j}" for j in range(21)],
          ["2", "1", "14102523"] + [f"w{j % 3}" for j in range(21)],
          ["3", "0", "14103007"] + [""] * 21]
  with open(f"{tmp_path}/a.csv", "w") as f:
    f.write("\n".join([header] + [",".join(r) for r in rows]) + "\n")
  c = ctr.get_config("smoke")
  c.data.format, c.data.hash_rows = "avazu", 1000
  c.data.train_path = c.data.eval_path = f"{tmp_path}/a.csv"
  data = dataset_lib.make_dataset(c.data, c.seed)
  parser = _parser(data, c, tmp_path)
  want = next(iter(data.chunks("eval")))
  lines = [",".join(r) for r in rows]
  np.testing.assert_array_equal(parser(lines).ids, want.ids)
  dicts = [dict(zip(("hour",) + avazu.CATEGORICAL_COLUMNS, r[2:], strict=True)) for r in rows]
  np.testing.assert_array_equal(parser(dicts).ids, want.ids)
  assert parser(dicts).dense.shape == (3, 0)
  with pytest.raises(RecordError, match="record 0: field 'hour'"):
    parser([dicts[0] | {"hour": "14109999"}])
