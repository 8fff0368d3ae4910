"""Export a run's trained embedding table in a format read by numpy alone.

`export_checkpoint(workdir, out_dir)` reads the newest good checkpoint of
`workdir/checkpoints/` (either backend, through `sfjax.checkpoint.reader`) and writes

  out_dir/
    export.json              manifest (below); written last
    values/rows_<lo>.npy     float32 [n, E]  rows [lo, lo + n) of the concatenated table
                             (a half-width run's: float16, or bfloat16 as uint16 bits)
    slots/rows_<lo>.npy      float32 [n, S]  the row optimizer's slots of the same rows
    mapping/                 preprocessed data only: a copy of DIR/mapping.json (+ vocabulary/)

export.json holds `num_rows`, `width`, `slot_width`, `row_optimizer`, `chunk_rows`, per
field `field_names` / `field_rows` / `field_offsets` (field f owns rows
`[field_offsets[f], field_offsets[f] + field_rows[f])`), every file with its row range,
size and CRC-32, and `mapping`: how a raw feature value becomes a row (hashing: the key
function, its per-field salt and `hash_rows`; a preprocessed directory's vocabulary:
copied; a vocabulary built on the fly from text: not saved, rebuild it with
`experiments.preprocess` over the same files).

Every row is written, trained or not (a never-written row holds its deterministic
initial value), so a reader needs no sfjax code: `np.load` each file, concatenate.
Plain `.npy` chunks, not zarr or tensorstore: the table is a dense float32 array, for
which `.npy` is exact, memory-mappable and readable by any numpy, with no further
dependency. Half-width rows (`embedding.dtype`) are exported in their dtype: export.json's
`dtype` says which; bfloat16 has no numpy dtype, so its files hold the uint16 bits
(`values_storage`), which numpy alone widens exactly: `(bits.astype(np.uint32) << 16).view(
np.float32)`. The cache backend's device cache needs no export: checkpoints are taken
after it is flushed to the host table.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from typing import Any

import ml_collections
import numpy as np

from sfjax.checkpoint import reader
from sfjax.core import digest
from sfjax.core.atomic import atomic_write
from sfjax.embedding import row_dtype
from sfjax.embedding.host_table import CHUNK_ROWS

_FORMAT_NAME = "sfjax.table_export"
_FORMAT_VERSION = 1
_MANIFEST_FILE = "export.json"


def _load_config(workdir: str) -> ml_collections.ConfigDict:
  path = os.path.join(workdir, "config.json")
  with open(path, encoding="utf-8") as f:
    return ml_collections.ConfigDict(json.load(f))


def _check_trained_mapping(meta: dict[str, Any], mapping_file: str) -> None:
  """Refuses a `mapping.json` that is not the one the run trained on (the checkpoint's data
  fingerprint, `sfjax.train.resume_check`, records its size and CRC-32; older checkpoints
  record none and pass)."""
  files = meta.get("fingerprint", {}).get("data", {}).get("data.train_path files", {})
  recorded = files.get(mapping_file)
  if recorded is None:
    return
  with open(mapping_file, "rb") as f:
    data = f.read()
  if (len(data), digest.crc32(data)) != (recorded.get("bytes"), recorded.get("crc32")):
    raise ValueError(f"{mapping_file}: not the mapping this run trained on (size/CRC-32 differ "
                     "from the checkpoint's record); the export would map values to the wrong "
                     "rows")


def _mapping(config, out_dir: str, meta: dict[str, Any]) -> dict[str, Any]:
  """The mapping settings of `config.data` (copying a preprocessed directory's files)."""
  d = config.data
  if d.format == "preprocessed":
    src = d.train_path
    _check_trained_mapping(meta, os.path.join(src, "mapping.json"))
    os.makedirs(os.path.join(out_dir, "mapping"))
    shutil.copyfile(os.path.join(src, "mapping.json"), os.path.join(out_dir, "mapping",
                                                                     "mapping.json"))
    if os.path.isdir(os.path.join(src, "vocabulary")):
      shutil.copytree(os.path.join(src, "vocabulary"), os.path.join(out_dir, "mapping",
                                                                    "vocabulary"))
    with open(os.path.join(src, "mapping.json"), encoding="utf-8") as f:
      settings = json.load(f)
    return {"kind": settings["kind"], "saved": "mapping/mapping.json",
            "note": "local row = mapping.json's rule; global row = local row + field_offsets[f]"}
  if d.format == "synthetic":
    return {"kind": "synthetic", "note": "synthetic data draws row ids directly; no raw values"}
  if int(d.hash_rows) > 0:
    return {"kind": "hashing", "hash_rows": int(d.hash_rows),
            "key": "sfjax.data.feature_map.value_keys: h = salt[f]; for each nonzero 8-byte "
                   "little-endian word w of the raw value's bytes (zero-padded): "
                   "h = splitmix64(h ^ w); key = splitmix64(h)",
            "salt": "salt[f] = splitmix64(f ^ 0xC7F0E1D2A3B4C5D6), f = field index",
            "row": "local row = key mod hash_rows; global row = local row + field_offsets[f]"}
  return {"kind": "vocabulary", "saved": None, "min_count": int(d.min_count),
          "note": "the vocabulary was built in memory from the text files and not saved; "
                  "rebuild it with `python -m experiments.preprocess` over the same files "
                  "(same data.min_count) and use its mapping.json"}


def _save_npy(out_dir: str, rel: str, array: np.ndarray, lo: int,
              dtype=np.float32) -> dict[str, Any]:
  """Writes `array` as rows of `dtype` (bfloat16: its uint16 bits) to `out_dir/rel`."""
  full = os.path.join(out_dir, rel)
  stored = np.ascontiguousarray(array, dtype)
  with open(full, "wb") as f:
    np.save(f, stored.view(row_dtype.storage_dtype(dtype)))
  return {"file": rel, "rows": [lo, lo + int(array.shape[0])], **digest.file_digest(full)}


def export_checkpoint(workdir: str, out_dir: str, checkpoint_path: str | None = None
                      ) -> dict[str, Any]:
  """Writes the table of `checkpoint_path` (default: the newest good one) to `out_dir`.

  Args:
    workdir: the run's workdir (`config.json`, `checkpoints/`).
    out_dir: created; must not exist or be empty. Written into `out_dir.tmp` first and
      renamed when complete.
    checkpoint_path: a `checkpoints/step_<N>` directory of the run.

  Returns:
    The manifest written as `out_dir/export.json`.

  Raises:
    FileNotFoundError: no checkpoint; layout.CorruptCheckpointError: none is good.
  """
  if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
    raise FileExistsError(f"{out_dir}: exists and is not empty")
  ckpt = reader.open_checkpoint(checkpoint_path or workdir)  # every file verified
  path, meta = ckpt.path, ckpt.meta
  if "fields" not in meta:
    raise ValueError(f"{path}: the checkpoint does not record its fields (saved before exports "
                     "existed); resume the run for one more checkpoint")
  config = _load_config(workdir)
  names = [f["name"] for f in meta["fields"]]
  rows = [int(f["rows"]) for f in meta["fields"]]
  offsets = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int64).tolist()
  tmp = out_dir.rstrip("/") + ".tmp"
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(os.path.join(tmp, "values"))
  os.makedirs(os.path.join(tmp, "slots"))
  table = ckpt.table
  value_files, slot_files = [], []
  for lo, values, slots in table.chunks():
    value_files.append(_save_npy(tmp, f"values/rows_{lo:012d}.npy", values, lo, table.dtype))
    slot_files.append(_save_npy(tmp, f"slots/rows_{lo:012d}.npy", slots, lo))
  num_rows, width, slot_width = table.num_rows, table.width, table.slot_width
  if num_rows != sum(rows):
    raise ValueError(f"{path}: the table has {num_rows} rows, its fields {sum(rows)}")
  manifest = {
      "format": _FORMAT_NAME, "version": _FORMAT_VERSION, "step": ckpt.step,
      "checkpoint": os.path.abspath(path), "dtype": row_dtype.dtype_name(table.dtype),
      **({"values_storage": "uint16"} if row_dtype.storage_dtype(table.dtype) != table.dtype
         else {}),  # bfloat16 rows as their bits
      "num_rows": num_rows,
      "width": width, "slot_width": slot_width, "chunk_rows": CHUNK_ROWS,
      "row_optimizer": config.embedding.optimizer, "model": config.model.name,
      "embedding_layout": "models with first-order terms: row[:-1] is the field vector, "
                          "row[-1] the first-order weight",
      "field_names": names, "field_rows": rows, "field_offsets": offsets,
      # A feature layout (bags, sequences, shared tables): the field_* entries above are
      # then its tables' row ranges, and `features` says which feature reads which table.
      **({"features": meta["features"]} if "features" in meta else {}),
      "mapping": _mapping(config, tmp, meta), "values": value_files, "slots": slot_files,
  }
  atomic_write(os.path.join(tmp, _MANIFEST_FILE), json.dumps(manifest, indent=1))
  if os.path.isdir(out_dir):
    os.rmdir(out_dir)
  os.rename(tmp, out_dir)
  return manifest


def read_export(out_dir: str) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
  """(manifest, values [V,E] (its `dtype`), slots [V,S]) of an export, checking every CRC."""
  with open(os.path.join(out_dir, _MANIFEST_FILE), encoding="utf-8") as f:
    manifest = json.load(f)
  parts = {}
  for kind in ("values", "slots"):
    arrays = []
    for entry in manifest[kind]:
      with open(os.path.join(out_dir, entry["file"]), "rb") as f:
        data = f.read()
      why = digest.mismatch(digest.bytes_digest(data), entry)
      if why:
        raise ValueError(f"{os.path.join(out_dir, entry['file'])}: CRC-32 mismatch ({why})")
      arrays.append(np.load(io.BytesIO(data)))
    parts[kind] = np.concatenate(arrays)
  values = row_dtype.from_storage(parts["values"], manifest.get("dtype", "float32"))
  return manifest, values, parts["slots"]
