"""CTR models as Flax NNX modules: `model(emb [B,F,E], dense [B,Nd]) -> logits [B]`."""

from sfjax.models.autoint import AutoInt, InteractingLayer
from sfjax.models.behavior.din import DIN, DIN_POOLINGS
from sfjax.models.behavior.pooling import PooledInput, pool_features
from sfjax.models.composed import ComposedModel
from sfjax.models.dcnv2 import CROSS_STRUCTURES, CrossLayer, DCNv2
from sfjax.models.deep_blocks import bottom_space, tower_space
from sfjax.models.deepfm import DeepFM
from sfjax.models.dlrm import DLRM, num_interactions, pairwise_dot_interactions
from sfjax.models.field_layout import EMBEDDING_DIMS, MAX_FIELD_GROUPS, embedding_space
from sfjax.models.fm import FM, fm_pairwise
from sfjax.models.generator import (
    BLOCK_TYPES,
    BLOCK_USE_KEY,
    COMBINES,
    COMPOSED_NAME,
    SpecError,
    build_from_spec,
    config_to_spec,
    named_model_spec,
    spec_embedding_width,
    spec_from_json,
    spec_to_config,
    spec_to_json,
)
from sfjax.models.layers import MLP, DenseLinear
from sfjax.models.lr import LR
from sfjax.models.registry import (
    ALL_MODEL_NAMES,
    HPARAM_KEYS,
    MODEL_NAMES,
    SEQUENCE_MODEL_NAMES,
    TRAIN_MODEL_NAMES,
    build_model,
    build_model_from_config,
    embedding_width,
    latent_dim,
    model_class,
    model_hparams,
    table_latent_dim,
)
from sfjax.models.wide_deep import WideDeep
from sfjax.models.xdeepfm import CIN, XDeepFM

__all__ = [
  "MAX_FIELD_GROUPS",
  "PooledInput",
  "pool_features",
  "ALL_MODEL_NAMES",
  "BLOCK_TYPES",
  "BLOCK_USE_KEY",
  "COMBINES",
  "COMPOSED_NAME",
  "EMBEDDING_DIMS",
  "AutoInt",
  "CIN",
  "CROSS_STRUCTURES",
  "ComposedModel",
  "CrossLayer",
  "DCNv2",
  "DIN",
  "DIN_POOLINGS",
  "DLRM",
  "DeepFM",
  "DenseLinear",
  "FM",
  "HPARAM_KEYS",
  "InteractingLayer",
  "LR",
  "MLP",
  "MODEL_NAMES",
  "SEQUENCE_MODEL_NAMES",
  "TRAIN_MODEL_NAMES",
  "WideDeep",
  "XDeepFM",
  "bottom_space",
  "build_from_spec",
  "build_model",
  "build_model_from_config",
  "config_to_spec",
  "embedding_space",
  "embedding_width",
  "fm_pairwise",
  "model_class",
  "model_hparams",
  "named_model_spec",
  "num_interactions",
  "pairwise_dot_interactions",
  "spec_embedding_width",
  "spec_from_json",
  "spec_to_config",
  "SpecError",
  "spec_to_json",
  "latent_dim",
  "table_latent_dim",
  "tower_space",
]
