"""Write a serving bundle from a trained run: `write_bundle(workdir, out_dir)`.

Reads the run's newest good checkpoint (`sfjax.checkpoint.open_checkpoint`: dense params
and the table of either backend, however many devices or row shards trained it, so
every such run gives the same bundle) and its `config.json`, rebuilds the model, and
writes the directory `sfjax.serving.manifest` describes: the forward function
`(dense leaves, emb [B, F, E], dense [B, Nd]) -> logits [B]` exported with `jax.export`
(StableHLO with a symbolic batch dimension B, so the predictor needs no model code, no
flax and no config), the dense leaves as `.npy`, the table as chunked `.npy` files
(float32, float16, or int8 with per-row scales), the feature mapping and specs.

A run on a feature layout (bags, weighted bags, sequences, shared tables; issue #22; its
checkpoint records `meta["features"]`) exports the layout model's forward
`(dense leaves, emb [B, S, E], dense [B, Nd], weights [B, S]) -> logits [B]` (the
`sfjax.models.behavior.pooling.PooledInput` wrapper pools the S id columns; DIN reads its
sequence unpooled) and records the layout in the manifest (`layout`, and per feature
its table, capacity, columns, pooling and weighting).

The forward is the trainer's (`sfjax.train.step.forward_logits`: `nnx.merge(graphdef,
params)(emb, dense)`), so the predictor's logits equal the trainer's eval logits. It is
lowered for CPU and CUDA (`SERVING_PLATFORMS`), so one bundle serves on either host.

A cache-backend run whose host table is lazily initialised (`embedding.host_storage=mmap`,
or fewer than half its rows ever written: `table_storage="auto"`) gets a lazy table
(`sfjax.serving.lazy_table`): its written rows and the rule that computes every other
row as the trainer's host table did, so a 10^9-row table's bundle is as large as the
rows trained, and nothing [V]-sized is ever built.

`write_pruned_bundle` writes the compression step's pruned model (`pruned_model.npz`:
its int8 codes and per-row scales stored as they are) through the same path.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging
from flax import nnx

import sfjax
from sfjax import models
from sfjax.checkpoint import open_checkpoint, reader, table_shards
from sfjax.core import feature_layout as fl
from sfjax.core.atomic import atomic_write
from sfjax.data import avazu, criteo, dataset, feature_map
from sfjax.embedding.host_table import CHUNK_ROWS
from sfjax.serving import lazy_table
from sfjax.serving import manifest as manifest_lib
from sfjax.serving.row_source import quantize_int8

_TEXT_FORMATS = {"criteo": criteo.CriteoFormat, "avazu": avazu.AvazuFormat}
SERVING_PLATFORMS = ("cpu", "cuda")  # the forward is lowered for both (jax.export)
TABLE_STORAGES = ("auto", "dense", "lazy")

# out dir -> the table's manifest entry, its files written under out/table.
TableWriter = Callable[[str], dict[str, Any]]


def _load_config(workdir: str) -> ml_collections.ConfigDict:
  path = os.path.join(workdir, "config.json")
  try:
    with open(path, encoding="utf-8") as f:
      return ml_collections.ConfigDict(json.load(f))
  except (OSError, ValueError) as err:
    raise ValueError(f"{path}: cannot read the run's config: {err}") from err


def _dense_names(config, data_set) -> list[str]:
  """Names of the Nd dense inputs (Criteo's I1..I13; else d0..)."""
  fmt = str(config.data.format)
  if fmt == "criteo":
    return [f"I{i}" for i in range(1, criteo.NUM_DENSE + 1)]
  if fmt == "avazu":
    return []
  if fmt == "synthetic":
    num_dense = int(config.data.synthetic.num_dense)
  elif fmt == "multihot":
    num_dense = int(config.data.multihot.num_dense)
  else:
    num_dense = data_set().spec.num_dense
  return [f"d{i}" for i in range(num_dense)]


def feature_mapping(config, field_rows: list[int], out: str, data_set,
                    layout: fl.FeatureLayout | None = None) -> tuple[str, dict[str, Any]]:
  """(record format, mapping entry) of the run's data; vocabulary keys saved under out/mapping."""
  d, num_fields = config.data, len(field_rows)
  fmt = str(d.format)
  if layout is not None:
    return "ids", {"kind": "ids", "note": f"data.format={fmt!r} with a feature layout: records "
                   "give local row ids, lists of them for bags and sequences"}
  if fmt not in _TEXT_FORMATS:
    return "ids", {"kind": "ids", "note": f"data.format={fmt!r}: records give local row ids"}
  salts = [f"{int(s):016x}" for s in feature_map._field_salts(num_fields)]  # noqa: SLF001
  key_rule = ("h = salt[f]; for each nonzero 8-byte little-endian word w of the raw value's "
              "bytes (zero-padded): h = splitmix64(h ^ w); key = splitmix64(h)")
  if int(d.hash_rows) > 0:
    return fmt, {"kind": "hashing", "hash_rows": int(d.hash_rows), "salts": salts,
                 "key": key_rule, "row": "local row = key mod hash_rows"}
  vocab = data_set().mapper  # the same one-pass build over the train files as training
  if list(vocab.field_rows) != field_rows:
    raise ValueError(f"{d.train_path}: the vocabulary rebuilt from the train files has "
                     f"{list(vocab.field_rows)} rows per field, the checkpoint {field_rows}")
  os.makedirs(os.path.join(out, "mapping"))
  files = []
  for f, keys in enumerate(vocab.keys):
    files.append(f"mapping/vocab_{f:03d}.npy")
    np.save(os.path.join(out, files[-1]), np.asarray(keys, np.uint64))
  return fmt, {"kind": "vocabulary", "salts": salts, "files": files, "key": key_rule,
               "min_count": int(d.min_count),
               "row": "local row = 1 + position of key in vocab_<f> (sorted); absent: 0"}


def _export_forward(graphdef, leaves, treedef, num_fields: int, width: int,
                    num_dense: int, weighted: bool = False) -> tuple[bytes, list[str]]:
  """(serialized `jax.export` of the forward with batch symbolic, its platforms).

  `weighted`: a feature layout model, `(leaves, emb [B, S, E], dense, weights [B, S])`
  with S = `num_fields` id columns; else `(leaves, emb [B, F, E], dense)`.
  """

  def forward(leaves, emb, dense, *weights):  # [B, F|S, E], [B, Nd] (, [B, S]) -> [B]
    return nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))(emb, dense, *weights)

  (b,) = jax.export.symbolic_shape("b")
  args = ([jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves],
          jax.ShapeDtypeStruct((b, num_fields, width), np.float32),
          jax.ShapeDtypeStruct((b, num_dense), np.float32),
          *([jax.ShapeDtypeStruct((b, num_fields), np.float32)] if weighted else []))
  try:  # one bundle for CPU and GPU hosts; a model CUDA cannot lower: this host's platform
    exported = jax.export.export(jax.jit(forward), platforms=SERVING_PLATFORMS)(*args)
  except Exception as err:  # noqa: BLE001 (jax raises several kinds; the fallback is logged)
    logging.warning("exporting the forward for %s failed (%s); exporting for this host's "
                    "platform only", SERVING_PLATFORMS, err)
    exported = jax.export.export(jax.jit(forward))(*args)
  return bytes(exported.serialize()), list(exported.platforms)


def _write_table(chunks, out: str, *, dtype: str, num_rows: int, width: int) -> dict[str, Any]:
  """`table/rows_<lo>.npy` (+ int8 scales) of `chunks`; the table's manifest entry.

  Args:
    chunks: (first row, rows [n, E] float32, None) or, already quantized, (first row,
      int8 codes [n, E], float32 scales [n]) in row order.
  """
  os.makedirs(os.path.join(out, "table"))
  entries = []
  for lo, values, scales in chunks:
    entry: dict[str, Any] = {"rows": [lo, lo + int(values.shape[0])],
                             "values": f"table/rows_{lo:012d}.npy"}
    if dtype == "int8" and scales is None:
      values, scales = quantize_int8(values)
    if scales is not None:
      entry["scales"] = f"table/scales_{lo:012d}.npy"
      np.save(os.path.join(out, entry["scales"]), np.asarray(scales, np.float32))
    np.save(os.path.join(out, entry["values"]), np.ascontiguousarray(values.astype(dtype)))
    entries.append(entry)
  return {"name": "table", "storage": "dense", "rows": int(num_rows), "dim": int(width),
          "dtype": dtype, "chunk_rows": CHUNK_ROWS, "chunks": entries}


def _final_metrics(meta: dict[str, Any]) -> dict[str, Any]:
  """The checkpoint's last eval record (numbers only)."""
  history = meta.get("history") or [{}]
  return {k: v for k, v in history[-1].items() if isinstance(v, (int, float))}


def write_bundle(workdir: str, out_dir: str, *, dtype: str = "float32",
                 checkpoint: str | None = None, table_storage: str = "auto") -> dict[str, Any]:
  """Writes the serving bundle of a run.

  Args:
    workdir: the run's workdir (`config.json`, `checkpoints/`).
    out_dir: created; must not exist or be empty (written as `out_dir.tmp`, then renamed).
    dtype: table storage: "float32", "float16" or "int8" (per-row symmetric scales).
    checkpoint: a `checkpoints/step_<N>` directory (default: the newest good one).
    table_storage: "dense" (every row stored), "lazy" (the written rows and the init rule;
      a cache-backend checkpoint only) or "auto": lazy for a cache-backend run whose host
      table was memory-mapped (`embedding.host_storage=mmap`) or has fewer than half its
      rows written, else dense.

  Returns:
    The manifest written as `out_dir/manifest.json`.

  Raises:
    ValueError: a bad dtype or table_storage, a checkpoint without its fields, an
      unreadable config, "lazy" for a device-backend checkpoint.
    FileExistsError: `out_dir` exists and is not empty.
  """
  if dtype not in manifest_lib.TABLE_DTYPES:
    raise ValueError(f"--dtype: must be one of {', '.join(manifest_lib.TABLE_DTYPES)}, "
                     f"got {dtype!r}")
  if table_storage not in TABLE_STORAGES:
    raise ValueError(f"--table_storage: must be one of {', '.join(TABLE_STORAGES)}, "
                     f"got {table_storage!r}")
  if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
    raise FileExistsError(f"{out_dir}: exists and is not empty")
  ckpt = open_checkpoint(checkpoint or workdir)  # every file verified
  if "fields" not in ckpt.meta:
    raise ValueError(f"{ckpt.path}: the checkpoint does not record its fields (saved before "
                     "exports existed); resume the run for one more checkpoint")
  config = _load_config(workdir)
  source = {"step": ckpt.step, "checkpoint": os.path.abspath(ckpt.path),
            "metrics": _final_metrics(ckpt.meta)}
  table = ckpt.table
  write_table = _lazy_writer(ckpt, config, table_storage, dtype)
  if write_table is None:
    write_table = functools.partial(_write_table, ((lo, v, None) for lo, v, _ in table.chunks()),
                                    dtype=dtype, num_rows=table.num_rows, width=table.width)
  return _write(out_dir, config, config.model, ckpt.params, ckpt.meta["fields"], write_table,
                table.width, source, _checkpoint_layout(ckpt))


def _lazy_writer(ckpt, config, table_storage: str, dtype: str) -> TableWriter | None:
  """The lazy table's writer of `ckpt` when `table_storage` asks for one (see `write_bundle`);
  None: store every row."""
  if table_storage == "dense":
    return None
  if ckpt.table_kind not in reader.HOST_TABLE_KINDS:
    if table_storage == "lazy":
      raise ValueError(f"{ckpt.path}: --table_storage=lazy needs a cache-backend checkpoint (a "
                       f"host table that records its written rows), this one holds "
                       f"{ckpt.table_kind!r}")
    return None
  table_dir = os.path.join(ckpt.path, reader.TABLE_DIR)
  rows = table_shards.ShardedTableReader(table_dir)
  num_rows, width = int(rows.num_rows), int(rows.width)
  if table_storage == "auto" and str(config.embedding.get("host_storage", "ram")) != "mmap" and (
      2 * lazy_table.count_stored_rows(rows) >= num_rows):
    return None  # dense enough: every row stored
  rule = lazy_table.init_rule(rows.manifest, table_dir)
  return functools.partial(lazy_table.write_lazy_table,
                           written=lazy_table.written_rows(rows, CHUNK_ROWS),
                           num_rows=num_rows, width=width, dtype=dtype, rule=rule)


def _checkpoint_layout(ckpt) -> fl.FeatureLayout | None:
  """The feature layout the checkpoint's run trained on (meta["features"]), or None."""
  data = ckpt.meta.get("features")
  if not data:
    return None
  try:
    return fl.layout_from_json(data)
  except (TypeError, KeyError, ValueError) as err:
    raise ValueError(f"{ckpt.path}: meta.json field 'features' is not a feature layout: "
                     f"{err}") from err


def write_pruned_bundle(pruned_file: str, model_cfg: dict[str, Any], trainer_config: dict[str, Any],
                        checkpoint: str, out_dir: str) -> dict[str, Any]:
  """Writes the serving bundle of the compression step's pruned model (`pruned_model.npz`).

  Its table is stored as the step stored it: int8 `codes` with their per-row `scales`
  (the same symmetric scheme, `sfjax.compress.quant`; not re-quantized), or float32.

  Args:
    pruned_file: the step's `pruned_model.npz` (`params/<path>` arrays, `values` or
      `codes` + `scales`).
    model_cfg: the step output's `compressed_model` (the pruned model's `model.*` block).
    trainer_config: the trained model's config (the pipeline's `trainer_config`).
    checkpoint: the checkpoint the step compressed (`source_checkpoint`; its fields).
    out_dir: as for `write_bundle`.
  """
  if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
    raise FileExistsError(f"{out_dir}: exists and is not empty")
  ckpt = open_checkpoint(checkpoint, verify=False)
  if "fields" not in ckpt.meta:
    raise ValueError(f"{ckpt.path}: the checkpoint does not record its fields")
  config = ml_collections.ConfigDict(dict(trainer_config))
  with np.load(pruned_file) as z:
    arrays = {k: z[k] for k in z.files}
  params: dict = {}
  for key, value in arrays.items():
    if key.startswith("params/"):
      node, parts = params, [int(p) if p.isdigit() else p for p in key.split("/")[1:]]
      for part in parts[:-1]:
        node = node.setdefault(part, {})
      node[parts[-1]] = value
  quantized = "codes" in arrays
  values = arrays["codes"] if quantized else arrays["values"]
  num_rows, width = values.shape
  chunks = ((lo, values[lo:lo + CHUNK_ROWS],
             arrays["scales"][lo:lo + CHUNK_ROWS] if quantized else None)
            for lo in range(0, num_rows, CHUNK_ROWS))
  source = {"step": ckpt.step, "checkpoint": os.path.abspath(ckpt.path),
            "pruned_model": os.path.abspath(pruned_file), "metrics": {}}
  write_table = functools.partial(_write_table, chunks, dtype="int8" if quantized else "float32",
                                  num_rows=num_rows, width=width)
  return _write(out_dir, config, model_cfg, params, ckpt.meta["fields"], write_table, width,
                source, _checkpoint_layout(ckpt))


def _write(out_dir: str, config, model_cfg, params: dict, fields: list[dict],
           write_table: TableWriter, width: int, source: dict[str, Any],
           layout: fl.FeatureLayout | None = None) -> dict[str, Any]:
  """The bundle of model `model_cfg` with pure-dict `params` and the table `write_table`
  writes (rows of width E = `width`) over `fields` ({name, rows}: the fields, or a
  layout's tables); `config` gives the data mapping."""
  cached: list = []

  def data_set():  # built only when needed (a vocabulary, an unknown dense count)
    if not cached:
      cached.append(dataset.make_dataset(config.data, config.seed))
    return cached[0]

  field_names = [f["name"] for f in fields]
  field_rows = [int(f["rows"]) for f in fields]
  offsets = np.concatenate([[0], np.cumsum(field_rows)[:-1]]).astype(np.int64).tolist()
  if layout is not None and fl.table_ranges(layout) != [
      {"name": n, "rows": r} for n, r in zip(field_names, field_rows, strict=True)]:
    raise ValueError(f"{source['checkpoint']}: meta.json 'fields' are not the row ranges of "
                     "the tables its 'features' layout declares")
  dense_names = _dense_names(config, data_set)
  model = models.build_model_from_config(
      model_cfg, num_fields=len(field_names) if layout is None else layout.num_features,
      num_dense=len(dense_names), rngs=nnx.Rngs(0), layout=layout)
  graphdef, state = nnx.split(model)
  nnx.replace_by_pure_dict(state, reader.with_empty_leaves(params, nnx.to_pure_dict(state)))
  leaves, treedef = jax.tree.flatten(state)
  leaves = [np.asarray(x) for x in leaves]

  tmp = out_dir.rstrip("/") + ".tmp"
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(os.path.join(tmp, "dense"))
  columns = len(field_names) if layout is None else layout.num_columns
  forward, platforms = _export_forward(graphdef, leaves, treedef, columns, width,
                                       len(dense_names), weighted=layout is not None)
  with open(os.path.join(tmp, "forward.bin"), "wb") as f:
    f.write(forward)
  leaf_files = []
  for i, leaf in enumerate(leaves):
    leaf_files.append(f"dense/leaf_{i:04d}.npy")
    np.save(os.path.join(tmp, leaf_files[-1]), leaf)
  table = write_table(tmp)
  lazy = table.get("storage") == lazy_table.STORAGE
  record_format, mapping = feature_mapping(config, field_rows, tmp, data_set, layout)
  inputs = {"emb": ["B", columns, width], "dense": ["B", len(dense_names)]}
  if layout is not None:
    inputs["weights"] = ["B", columns]
  paths = [str(p) for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
  manifest = {
      "format": manifest_lib.FORMAT_NAME,
      "version": manifest_lib.LAZY_FORMAT_VERSION if lazy else manifest_lib.FORMAT_VERSION,
      "sfjax_version": getattr(sfjax, "__version__", "unknown"), "jax_version": jax.__version__,
      "model": str(model_cfg["name"]), "model_config": _jsonable(model_cfg), **source,
      "record_format": record_format,
      "features": (_layout_features(layout) if layout is not None else
                   [{"name": n, "kind": "one_hot", "table": "table", "rows": r, "offset": o}
                    for n, r, o in zip(field_names, field_rows, offsets, strict=True)]),
      **({"layout": fl.layout_to_json(layout)} if layout is not None else {}),
      "dense": {"names": dense_names,
                "transform": "signed_log1p" if record_format == "criteo" else "none"},
      "mapping": mapping, "tables": [table],
      "forward": {"file": "forward.bin", "platforms": platforms, "inputs": inputs,
                  "output": ["B"],
                  "params": [{"file": f, "path": p, "shape": list(x.shape), "dtype": str(x.dtype)}
                             for f, p, x in zip(leaf_files, paths, leaves, strict=True)]},
  }
  rel = ["forward.bin", *leaf_files, *mapping.get("files", [])]
  rel.extend([table["written"]["ids"]] if lazy else [])  # a lazy table's written row ids
  for c in table["chunks"]:
    rel.extend(c[k] for k in ("values", "scales") if k in c)
  manifest["files"] = [manifest_lib.file_entry(tmp, r) for r in rel]
  atomic_write(os.path.join(tmp, manifest_lib.MANIFEST_FILE), json.dumps(manifest, indent=1))
  if os.path.isdir(out_dir):
    os.rmdir(out_dir)
  os.rename(tmp, out_dir)
  return manifest


def _layout_features(layout: fl.FeatureLayout) -> list[dict[str, Any]]:
  """Manifest entries of a layout's features: the table each reads (its rows and start
  in the stored table), its id columns [start, stop), kind, pooling and weighting."""
  offsets = layout.table_offsets
  out = []
  for f, spec in enumerate(layout.features):
    t, cols = layout.feature_tables[f], layout.columns(f)
    out.append({"name": spec.name, "kind": spec.kind, "table": spec.table,
                "rows": int(layout.tables[t].num_rows), "offset": int(offsets[t]),
                "capacity": int(spec.capacity), "columns": [cols.start, cols.stop],
                "pooling": spec.pooling, "weighted": bool(spec.weighted)})
  return out


def _jsonable(model_cfg) -> dict[str, Any]:
  """The `model.*` block as plain JSON values (tuples as lists)."""
  return json.loads(json.dumps(dict(model_cfg.items()), default=list))
