"""sfjax.data: CTR data sets, their batches and their feature specs.

  make_dataset(config.data, seed) -> CTRDataset   one entry for every format (synthetic,
                                                  Criteo, Avazu, MovieLens, preprocessed)
  SyntheticCTR                                    Criteo-like data with planted signal
  MultihotCTR                                     bags, long bags and a history sequence
                                                  with a planted model (format multihot)
  preprocess_files(...)                           text files -> memory-mapped shards
  dataset_digests(DIR)                            spec / mapping / split digests of a
                                                  preprocessed directory (checked)
  Batch / DatasetSpec / FieldSpec                 what a data set yields and describes

Modules: readers (`criteo`, `avazu`, `movielens`, `text_io`), feature -> row mapping
(`feature_map`), generated data with planted models (the `generated` sub-package:
`synthetic`, `planted`, `multihot`, `multihot_model`), preprocessed shards
(`preprocessed`, `preprocessed_layout`, `shards`), value checks (`validate`), batching
(`batching`) and the types (`types`).
"""

from sfjax.data.dataset import KNOWN_FORMATS, CTRDataset, make_dataset
from sfjax.data.feature_pooling import parse_poolings
from sfjax.data.generated.multihot import MultihotConfig, MultihotCTR
from sfjax.data.generated.synthetic import (
  SyntheticConfig,
  SyntheticCTR,
  bounded_power_law_ranks,
  make_row_sampler,
)
from sfjax.data.preprocessed import DEFAULT_ROWS_PER_SHARD, preprocess_files
from sfjax.data.preprocessed_layout import dataset_digests
from sfjax.data.table_settings import parse_table_settings
from sfjax.data.types import Batch, DatasetSpec, FieldSpec, make_batch

__all__ = [
  "parse_poolings",
  "parse_table_settings",
  "DEFAULT_ROWS_PER_SHARD",
  "KNOWN_FORMATS",
  "Batch",
  "CTRDataset",
  "DatasetSpec",
  "FieldSpec",
  "MultihotCTR",
  "MultihotConfig",
  "SyntheticCTR",
  "SyntheticConfig",
  "bounded_power_law_ranks",
  "dataset_digests",
  "make_batch",
  "make_dataset",
  "make_row_sampler",
  "preprocess_files",
]
