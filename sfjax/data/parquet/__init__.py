"""The `parquet` format (`data.format=parquet`): Parquet files read with pyarrow by row group.

  columns   the `data.parquet` block: label, dense, categorical and list columns, bags and
            sequences, shared tables (`parse_columns`; ConfigError naming the field)
  reader    `RowGroupParser` (schema checks, a record batch -> `ParquetChunk`, bad rows
            named) and `ParquetReader` (a split's files in record batches, by chunk number)
  dataset   `ParquetDataset` (the `CTRDataset`) and `chunk_batch` (keys -> rows -> `Batch`)

The names below load pyarrow on first use (PEP 562), so checking a config stays light.
"""

import importlib

_LAZY = {"ParquetDataset": "sfjax.data.parquet.dataset",
         "chunk_batch": "sfjax.data.parquet.dataset",
         "ParquetChunk": "sfjax.data.parquet.reader",
         "ParquetReader": "sfjax.data.parquet.reader",
         "parse_columns": "sfjax.data.parquet.columns"}

__all__ = ["ParquetChunk", "ParquetDataset", "ParquetReader", "chunk_batch", "parse_columns"]


def __getattr__(name: str):
  """The format's names, imported on first access (PEP 562)."""
  if name in _LAZY:
    return getattr(importlib.import_module(_LAZY[name]), name)
  raise AttributeError(f"module 'sfjax.data.parquet' has no attribute {name!r}")
