"""The metadata files of a preprocessed directory, and the digests that tie them to its shards.

A preprocessed directory DIR (`preprocessed.preprocess_files` writes it) holds:

  spec.json        fields (name, rows), num_dense, the source format and files,
                   the mapping settings and mapping.json's CRC-32, examples and
                   dropped bad lines per split; with bags, sequences or shared
                   tables also the feature layout (`layout`: tables and features,
                   `feature_layout.layout_to_json`) and the ids truncated per split
  mapping.json     how raw values became ids: hashing (rows per field), or a
                   vocabulary and its key files (each with its size and CRC-32);
                   with a layout its fields are the TABLES (shared by features)
  vocabulary/<field>.keys.npy   (vocabulary only) [V_f] uint64 sorted value keys
                   (`feature_map.value_keys`): key i is row i + 1, row 0 is OOV
  train/ eval/ [test/]          `shards` split directories

Digests (issue #25, Why 4): every split's `split.json` records the CRC-32 of the
spec (spec.json without its per-split counts, as canonical JSON: `spec_crc32`) and
of mapping.json's bytes; opening DIR (`checked_digests`) recomputes both and
refuses a spec.json or mapping.json that does not belong to the shards, naming the
file; `dataset_digests` returns them, e.g. for a checkpoint's data fingerprint.
Directories written before the digests (format 1) are refused with one line
saying to preprocess again: their shards cannot be tied to their spec.
"""

from __future__ import annotations

import json
import os

import numpy as np

from sfjax.core import atomic, digest
from sfjax.core import feature_layout as fl
from sfjax.data import feature_map, shards
from sfjax.data.types import DatasetSpec, FieldSpec

SPEC_FILE = "spec.json"
MAPPING_FILE = "mapping.json"
VOCABULARY_DIR = "vocabulary"
SPLITS = ("train", "eval", "test")
KIND = "sfjax.preprocessed"
VERSION = 2  # 2: spec/mapping digests recorded in spec.json and every split.json
_UNDIGESTED = ("splits",)  # spec.json entries known only after the shards are written


def mapping_settings(mapper: feature_map.FeatureMapper) -> dict:
  """The JSON description of a mapper (spec.json's 'mapping')."""
  if isinstance(mapper, feature_map.HashingMapper):
    return {"kind": "hashing", "num_rows": int(mapper.num_rows)}
  if isinstance(mapper, feature_map.Vocabulary):
    return {"kind": "vocabulary", "min_count": int(mapper.min_count),
            "num_distinct": [int(n) for n in mapper.num_distinct]}
  raise TypeError(f"cannot store a mapper of type {type(mapper).__name__}")


def _crc32_hex(data: bytes) -> str:
  """The 8-hex-digit CRC-32 of `data` (the form split.json records files in)."""
  return f"{digest.crc32(data):08x}"


def spec_crc32(meta: dict) -> str:
  """CRC-32 of spec.json's content without its per-split counts, as canonical JSON."""
  identity = {k: v for k, v in meta.items() if k not in _UNDIGESTED}
  return _crc32_hex(json.dumps(identity, sort_keys=True, separators=(",", ":")).encode())


def save_mapping(mapper: feature_map.FeatureMapper, field_names, out_dir: str) -> str:
  """Writes mapping.json (and a vocabulary's keys) under `out_dir`; returns its CRC-32."""
  settings = dict(mapping_settings(mapper))
  settings["key"] = ("feature_map.value_keys: SplitMix64 over the raw value's bytes "
                     "(8-byte little-endian words) from a per-field salt")
  if isinstance(mapper, feature_map.HashingMapper):
    settings["row"] = "key mod num_rows"
  elif isinstance(mapper, feature_map.Vocabulary):  # mapping_settings rejected other mappers
    settings["row"] = "1 + position of the key in the field's sorted keys; 0 = out of vocabulary"
    settings["fields"] = []
    for name, keys in zip(field_names, mapper.keys, strict=True):
      rel = os.path.join(VOCABULARY_DIR, f"{name}.keys.npy")
      saved = shards.save_npy(os.path.join(out_dir, rel), np.asarray(keys, np.uint64))
      settings["fields"].append({"name": name, "keys": rel, "num_keys": int(keys.shape[0]),
                                 "bytes": saved["bytes"], "crc32": saved["crc32"]})
  text = json.dumps(settings, indent=1) + "\n"
  atomic.atomic_write(os.path.join(out_dir, MAPPING_FILE), text)
  return _crc32_hex(text.encode())


def load_mapping(root: str) -> feature_map.FeatureMapper:
  """The mapper that produced DIR's ids (maps new raw values the same way)."""
  with open(os.path.join(root, MAPPING_FILE)) as f:
    settings = json.load(f)
  if settings["kind"] == "hashing":
    return feature_map.HashingMapper(int(settings["num_rows"]))
  for fld in settings["fields"]:
    _check_keys_file(root, fld)
  keys = tuple(np.load(os.path.join(root, fld["keys"])) for fld in settings["fields"])
  return feature_map.Vocabulary(keys, int(settings["min_count"]),
                                tuple(int(n) for n in settings["num_distinct"]))


def _check_keys_file(root: str, field: dict) -> None:
  """CorruptShardError naming a vocabulary keys file whose size or CRC-32 is not mapping.json's."""
  path = os.path.join(root, field["keys"])
  if not os.path.isfile(path):
    raise shards.CorruptShardError(path, f"missing (listed in {MAPPING_FILE})")
  got = digest.file_digest(path)
  if got["bytes"] != field["bytes"] or f"{got['crc32']:08x}" != field["crc32"]:
    raise shards.CorruptShardError(path, f"{got['bytes']} bytes, CRC-32 {got['crc32']:08x}; "
                                         f"{MAPPING_FILE} says {field['bytes']}, "
                                         f"{field['crc32']} (replaced: preprocess again)")


def read_spec(root: str) -> dict:
  """Parses DIR/spec.json; CorruptShardError naming it if missing or malformed."""
  path = os.path.join(root, SPEC_FILE)
  if not os.path.exists(path):
    raise shards.CorruptShardError(path, "missing: not a preprocessed directory, or "
                                         "preprocessing did not finish (run experiments.preprocess)")
  try:
    with open(path) as f:
      meta = json.load(f)
    if meta.get("kind") == KIND and meta.get("version") == 1:
      raise shards.CorruptShardError(path, "written by an older sfjax (format 1: no spec/mapping "
                                           "digests to check the shards against); preprocess "
                                           "again (python -m experiments.preprocess ... "
                                           "--overwrite)")
    if meta.get("kind") != KIND or meta.get("version") != VERSION:
      raise ValueError(f"kind/version {meta.get('kind')!r}/{meta.get('version')!r}")
    meta["spec_crc32"] = spec_crc32(meta)
    str(meta["mapping_crc32"])  # a KeyError here is a malformed spec.json
    layout = fl.layout_from_json(meta["layout"]) if "layout" in meta else None
    meta["dataset_spec"] = DatasetSpec(
        tuple(FieldSpec(str(f["name"]), int(f["num_rows"])) for f in meta["fields"]),
        int(meta["num_dense"]), layout)
    meta["splits"] = dict(meta["splits"])
  except shards.CorruptShardError:
    raise
  except (ValueError, KeyError, TypeError) as exc:
    raise shards.CorruptShardError(path, f"malformed ({exc})") from exc
  return meta


def _mapping_crc32(root: str) -> str:
  """CRC-32 of DIR/mapping.json's bytes, after checking a vocabulary's key files against it."""
  path = os.path.join(root, MAPPING_FILE)
  if not os.path.isfile(path):
    raise shards.CorruptShardError(path, f"missing (every {SPEC_FILE} has one beside it)")
  with open(path, "rb") as f:
    raw = f.read()
  try:
    settings = json.loads(raw)
    for field in settings["fields"] if settings["kind"] == "vocabulary" else ():
      _check_keys_file(root, field)
  except shards.CorruptShardError:
    raise
  except (ValueError, KeyError, TypeError) as exc:
    raise shards.CorruptShardError(path, f"malformed ({exc!r})") from exc
  return _crc32_hex(raw)


def checked_digests(root: str, meta: dict, infos: dict[str, shards.SplitInfo]) -> dict:
  """The digests of DIR after checking spec.json and mapping.json against every split.

  Args:
    root: DIR.
    meta: `read_spec(root)`.
    infos: split name -> its `split.json` (`shards.read_split_info`).

  Returns:
    {'spec_crc32', 'mapping_crc32', 'splits': {name: CRC-32 of its split.json}}.

  Raises:
    CorruptShardError: naming spec.json when it does not match a split's fields,
      dense width, example count or recorded spec digest (swapped or edited), or
      mapping.json when its CRC-32 is not the one spec.json and the splits record.
  """
  spec_path, mapping_path = (os.path.join(root, n) for n in (SPEC_FILE, MAPPING_FILE))
  spec: DatasetSpec = meta["dataset_spec"]
  for name, info in infos.items():
    split_json = os.path.join(name, shards.SPLIT_FILE)
    if (info.num_fields, info.num_dense) != (spec.num_fields, spec.num_dense):
      raise shards.CorruptShardError(
          spec_path, f"says {spec.num_fields} fields / {spec.num_dense} dense, {split_json} "
                     f"{info.num_fields} / {info.num_dense}: replaced or edited")
    recorded = info.dataset.get("spec_crc32")
    same = (info.fields, info.layout) == (spec.fields, spec.layout)
    if not same or recorded != meta["spec_crc32"]:
      raise shards.CorruptShardError(
          spec_path, f"does not belong to the shards in {name}/ (spec CRC-32 "
                     f"{meta['spec_crc32']}, {split_json} records {recorded}): replaced or "
                     "edited; restore it or preprocess again")
    if info.num_examples != int(meta["splits"][name]["num_examples"]):
      raise shards.CorruptShardError(
          spec_path, f"says {meta['splits'][name]['num_examples']} {name} examples, "
                     f"{split_json} {info.num_examples}: replaced or edited")
  mapping_crc32 = _mapping_crc32(root)  # after the spec: a swapped spec.json is named as such
  splits = {}
  for name, info in infos.items():
    split_json = os.path.join(name, shards.SPLIT_FILE)
    recorded = info.dataset.get("mapping_crc32")
    if mapping_crc32 != recorded or mapping_crc32 != meta["mapping_crc32"]:
      raise shards.CorruptShardError(
          mapping_path, f"CRC-32 {mapping_crc32}, {split_json} records {recorded}: it does not "
                        "belong to these shards (replaced or edited); restore it or preprocess "
                        "again")
    with open(os.path.join(root, split_json), "rb") as f:
      splits[name] = _crc32_hex(f.read())
  return {"spec_crc32": meta["spec_crc32"], "mapping_crc32": mapping_crc32, "splits": splits}


def dataset_digests(root: str) -> dict:
  """The digests that identify a preprocessed directory, checked against each other.

  For a checkpoint's data fingerprint: cheap (reads the JSON files and a
  vocabulary's key files, not the shards, whose CRC-32s each split.json lists).

  Args:
    root: DIR, a preprocessed directory.

  Returns:
    {'spec_crc32': spec.json's identity (fields, num_dense, source, mapping
    settings; not the per-split counts), 'mapping_crc32': mapping.json's bytes,
    'splits': {split: CRC-32 of its split.json}} as 8-hex-digit strings.

  Raises:
    CorruptShardError: a missing, malformed or swapped spec.json, mapping.json
      or split.json (naming the file).
  """
  meta = read_spec(root)
  infos = {n: shards.read_split_info(os.path.join(root, n)) for n in SPLITS
           if n in meta["splits"]}
  return checked_digests(root, meta, infos)
