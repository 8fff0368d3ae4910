"""Resume checks what it resumes: a fingerprint of the run in every checkpoint, compared on resume.

Each checkpoint's meta.json holds `fingerprint(config, spec)`: the whole config (flattened
to dotted fields), the data set's layout (fields and their rows, dense features) and the
data files (per file: size and the CRC-32 of its first and last MiB, a content digest
that survives a copy, unlike an mtime; in a preprocessed directory each shard's first and
last 64 KiB, and the full CRC-32 of `spec.json` and `mapping.json`). On resume each field that differs is one of three kinds:

- shape: it changes the state's shape or structure, so the checkpoint cannot be loaded:
  every `model.*` field, `embedding.backend` (the table's place), `embedding.optimizer`
  and `optimizer.name` (the optimizer slots), `data.format`, `data.hash_rows`,
  `data.min_count` and the synthetic generator's `cardinality_scale`, `min_rows` and
  `num_dense` (the rows per field), and the data set's fields and rows themselves.
  Always refused (`ResumeMismatchError`), one line naming each field `old -> new`.
- free: it changes neither the state nor the results (issue #25 asked us to decide;
  each is tested): `train.steps` (extending or shortening a run; no learning-rate
  schedule reads it), `train.log_every`, `train.eval_batch_size`, `train.prefetch`,
  `train.loader_nice`, `train.loader_idle` and `train.host_allocator` (host threads and
  malloc: speed only), `train.xla_cpu_dots` (the dots' library: equal up to float rounding),
  `train.num_devices` (the batch is split otherwise: equal up to float summation order),
  the cache's size, policy, lookahead, sharding, unique capacity and host storage (the
  cache only holds exact copies of host rows), the device table's `embedding.sharding`
  and `embedding.placement` / `plan.*` (a checkpoint's table moves to the run's layout;
  a placement that changes the backend is refused by the checkpoint's table kind), `checkpoint.*`, `distributed.*` and
  `resume` itself. Accepted; recorded in `config_history.jsonl`.
- meaning: everything else (the seed, data paths and files, learning rates and other
  optimizer settings, `train.batch_size`, `train.eval_every`, the shuffle buffer, ...):
  the run would silently mix two experiments. Refused unless `config.resume` is
  'allow_changes' (`--resume=allow_changes` in `experiments.train_ctr`), which records the
  change in `config_history.jsonl`. A field unknown to these lists counts as meaning.

`config.json` is written once, by the workdir's first run; later differences go to
`config_history.jsonl` (one JSON object per resume or restart that changed something).
A checkpoint written before fingerprints existed resumes with a warning. Issue #25, item 2.
"""

from __future__ import annotations

import datetime
import functools
import glob
import json
import os
import zlib
from collections.abc import Mapping
from typing import Any

from absl import logging

from sfjax.core import feature_layout
from sfjax.core.atomic import atomic_write
from sfjax.core.errors import ConfigError
from sfjax.train import defaults

FINGERPRINT_KEY = "fingerprint"  # the field of a checkpoint's meta.json
CONFIG_FILE, HISTORY_FILE = "config.json", "config_history.jsonl"
RESUME_POLICIES = ("strict", "allow_changes")  # config.resume
_SAMPLE = 1 << 20  # bytes digested at each end of a data file
_SHARD_SAMPLE = 1 << 16  # ... and of each file of a preprocessed directory
_ABSENT = "<absent>"

_SHAPE = ("model.", "embedding.backend", "embedding.optimizer", "optimizer.name", "data.format",
          "data.hash_rows", "data.min_count", "data.synthetic.cardinality_scale",
          "data.synthetic.min_rows", "data.synthetic.num_dense", "data spec")
_FREE = ("train.steps", "train.log_every", "train.eval_batch_size", "train.prefetch",
         "train.loader_nice", "train.loader_idle", "train.host_allocator", "train.xla_cpu_dots",
         "train.num_devices", "embedding.cache_rows", "embedding.cache_policy",
         "embedding.lookahead", "embedding.keep_upcoming", "embedding.cache_sharding", "embedding.unique_capacity",
         "embedding.host_storage", "embedding.host_path", "embedding.sharding",
         "embedding.placement", "embedding.plan.", "checkpoint.", "distributed.", "resume")


class ResumeMismatchError(ConfigError):
  """The checkpoint was written by a run with a different config or data; names each field."""


def _matches(field: str, prefixes: tuple[str, ...]) -> bool:
  return any(field == p or (p.endswith(".") and field.startswith(p)) for p in prefixes)


def field_kind(field: str) -> str:
  """'shape', 'free' or 'meaning' for a dotted config field (the module docstring's lists)."""
  if _matches(field, _SHAPE):
    return "shape"
  return "free" if _matches(field, _FREE) else "meaning"


def _flatten(tree: Any) -> dict[str, Any]:
  """`{dotted field: value}` of nested dicts (an empty dict is a value)."""
  out: dict[str, Any] = {}

  def walk(prefix: str, node: Any) -> None:
    if isinstance(node, dict) and node:
      for key, value in node.items():
        walk(f"{prefix}.{key}" if prefix else str(key), value)
    else:
      out[prefix] = node

  walk("", tree)
  return out


def flat_config(config) -> dict[str, Any]:
  """`{dotted field: JSON value}` of a ConfigDict (tuples become lists)."""
  return _flatten(json.loads(config.to_json_best_effort()))


def _file_sample_digest(path: str, sample: int = _SAMPLE) -> dict[str, int]:
  """`{"bytes", "crc32"}` of a file: its size and the CRC-32 of its first and last `sample`
  bytes."""
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    crc = zlib.crc32(f.read(sample))
    if size > 2 * sample:
      f.seek(size - sample)
      crc = zlib.crc32(f.read(sample), crc)
    elif size > sample:
      crc = zlib.crc32(f.read(), crc)
  return {"bytes": size, "crc32": crc}


def _tree_digests(root: str) -> dict[str, dict[str, int]]:
  """Digests of every file under directory `root`, keyed by relative path (spec.json and
  mapping.json digested whole: they say what the ids mean)."""
  out = {}
  for dirpath, _, names in sorted(os.walk(root)):
    for name in sorted(names):
      full = os.path.join(dirpath, name)
      rel = os.path.relpath(full, root)
      if rel in ("spec.json", "mapping.json"):
        with open(full, "rb") as f:
          data = f.read()
        out[rel] = {"bytes": len(data), "crc32": zlib.crc32(data)}
      else:  # shards: many, each CRC-checked on read; 64 KiB at each end marks a rewrite
        out[rel] = _file_sample_digest(full, _SHARD_SAMPLE)
  return out


def data_fingerprint(data_cfg) -> dict[str, Any]:
  """`{field: {file: digest}}` of `data.train_path`/`eval_path`/`test_path` (each a comma-
  separated list of globs, files or a preprocessed directory); {} for generated data."""
  out: dict[str, Any] = {}
  for field in ("train_path", "eval_path", "test_path"):
    spec = str(data_cfg.get(field, "") or "")
    files: dict[str, Any] = {}
    for pattern in (p.strip() for p in spec.split(",") if p.strip()):
      for match in sorted(glob.glob(os.path.expanduser(pattern))):
        if os.path.isdir(match):
          files.update({os.path.join(match, k): v for k, v in _tree_digests(match).items()})
        elif os.path.isfile(match):
          files[match] = _file_sample_digest(match)
    if files:
      out[f"data.{field} files"] = files
  return out


def spec_fingerprint(spec) -> dict[str, Any]:
  """The data set's layout: `{"fields": [[name, rows], ...], "num_dense": D}` (+ its
  feature layout's tables and features when it has bags or sequences)."""
  out = {"fields": [[f.name, int(f.num_rows)] for f in spec.fields],
         "num_dense": int(spec.num_dense)}
  if getattr(spec, "layout", None) is not None:
    out["features"] = feature_layout.layout_to_json(spec.layout)
  return out


def fingerprint(config, spec) -> dict[str, Any]:
  """What a checkpoint records of its run: config fields, data layout and data files."""
  return {"config": flat_config(config), "spec": spec_fingerprint(spec),
          "data": data_fingerprint(config.data)}


def _short(value: Any) -> str:
  text = json.dumps(value, sort_keys=True)
  return text if len(text) <= 60 else text[:57] + "..."


def _file_changes(field: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
  """`data.train_path files: a (bytes 10 -> 12), b (absent -> present)`."""
  parts = []
  for name in sorted(set(old) | set(new)):
    if name not in old or name not in new:
      parts.append(f"{name} ({'absent' if name not in old else 'present'} -> "
                   f"{'absent' if name not in new else 'present'})")
    elif old[name] != new[name]:
      what = ", ".join(f"{k} {old[name].get(k)} -> {new[name].get(k)}"
                       for k in sorted(set(old[name]) | set(new[name]))
                       if old[name].get(k) != new[name].get(k))
      parts.append(f"{name} ({what})")
  return f"{field}: {', '.join(parts)}"


@functools.cache
def _default_values() -> dict[str, Any]:
  """`flat_config` of today's defaults (`defaults.ctr_defaults`)."""
  return flat_config(defaults.ctr_defaults())


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, list]:
  """`{field: [old, new]}` of two fingerprints, config fields by their dotted names, the
  data layout as 'data spec' and each data file list as 'data.<split>_path files'.

  A field the old fingerprint lacks that holds its default now is no change: a newer
  sfjax added it (e.g. `model.din_attention_dims`), the older run behaved as the default.
  """
  out: dict[str, list] = {}
  old_cfg, new_cfg = old.get("config", {}), new.get("config", {})
  for field in sorted(set(old_cfg) | set(new_cfg)):
    a, b = old_cfg.get(field, _ABSENT), new_cfg.get(field, _ABSENT)
    if a is _ABSENT and b == _default_values().get(field, _ABSENT):
      continue  # a field added to the defaults since the checkpoint, at its default
    if a != b:
      out[field] = [a, b]
  if old.get("spec") != new.get("spec"):
    out["data spec"] = [old.get("spec"), new.get("spec")]
  old_data, new_data = old.get("data", {}), new.get("data", {})
  for field in sorted(set(old_data) | set(new_data)):
    a, b = old_data.get(field, {}), new_data.get(field, {})
    if a != b:
      out[field] = [a, b]
  return out


def describe_change(field: str, change: list) -> str:
  """One change as `field old -> new` (data files: the files that differ)."""
  old, new = change
  if field.endswith(" files"):
    return _file_changes(field, old, new)
  return f"{field} {_short(old)} -> {_short(new)}"


def check_resume(old: Mapping[str, Any] | None, new: Mapping[str, Any], policy: str,
                 checkpoint_path: str) -> dict[str, list]:
  """The changes between the checkpoint's fingerprint `old` and this run's `new`.

  Args:
    old: the checkpoint's fingerprint (None: written before fingerprints; not checked).
    new: this run's `fingerprint`.
    policy: `config.resume`, 'strict' or 'allow_changes'.
    checkpoint_path: the checkpoint, for the message.

  Returns:
    `{field: [old, new]}` of every difference (the caller records them).

  Raises:
    ResumeMismatchError: a shape difference (always), or a meaning difference under
      'strict'; one line naming each such field `old -> new`.
  """
  if policy not in RESUME_POLICIES:
    raise ConfigError(f"config field resume: unknown value {policy!r} "
                      f"(known: {', '.join(RESUME_POLICIES)})")
  if old is None:
    logging.warning("%s records no config fingerprint (an older checkpoint): resuming unchecked",
                    checkpoint_path)
    return {}
  changes = differences(old, new)
  shape = [describe_change(f, c) for f, c in changes.items() if field_kind(f) == "shape"]
  if shape:
    raise ResumeMismatchError(
        f"cannot resume {checkpoint_path}: the state's shape differs: {'; '.join(shape)} "
        "(use the checkpoint's settings or another workdir)")
  meaning = [describe_change(f, c) for f, c in changes.items() if field_kind(f) == "meaning"]
  if meaning and policy != "allow_changes":
    raise ResumeMismatchError(
        f"cannot resume {checkpoint_path}: the run's settings differ: {'; '.join(meaning)} "
        "(rerun with --config.resume=allow_changes to continue and record the change in "
        f"{HISTORY_FILE}, or use another workdir)")
  return changes


def record_config(workdir: str, config, event: str, changes: Mapping[str, list],
                  step: int = 0) -> None:
  """Writes `config.json` once and appends what changed to `config_history.jsonl`.

  Args:
    workdir: the run's directory.
    config: this run's config.
    event: 'resume' (continuing a checkpoint: `config.json` is kept) or 'start' (a run from
      step 0: `config.json` becomes this config, the old one's differences are recorded).
    changes: `{field: [old, new]}` (for 'start', compared here with the old config.json).
    step: the step resumed from.
  """
  path = os.path.join(workdir, CONFIG_FILE)
  text = config.to_json_best_effort(indent=2)
  if event == "start" and os.path.exists(path):
    try:
      with open(path, encoding="utf-8") as f:
        old = {"config": _flatten(json.loads(f.read()))}
    except (OSError, ValueError):
      old = {"config": {}}
    changes = differences(old, {"config": flat_config(config)})
    if changes:
      logging.warning("%s: a run from step 0 with another config; config.json is replaced, the "
                      "differences are recorded in %s", workdir, HISTORY_FILE)
      atomic_write(path, text)
  elif not os.path.exists(path):
    atomic_write(path, text)
  if not changes:
    return
  record = {"time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "event": event, "step": int(step),
            "changes": {f: {"old": c[0], "new": c[1], "kind": field_kind(f)}
                        for f, c in changes.items()}}
  with open(os.path.join(workdir, HISTORY_FILE), "a", encoding="utf-8") as f:
    f.write(json.dumps(record, sort_keys=True) + "\n")
    f.flush()
    os.fsync(f.fileno())

