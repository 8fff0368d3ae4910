"""Tests for block specs: canonical JSON, validation errors, pairs (sfjax/models/block_spec.py)."""

import json

import pytest

from sfjax.models import block_spec
from sfjax.models.block_spec import SpecError

DEEPFM = {"embedding": {"dims": [8]},
          "interactions": [{"type": "fm"}, {"type": "first_order"}],
          "tower": {"dims": [16]}}


def test_defaults_are_filled_and_json_is_canonical():
  spec = block_spec.validate_spec(DEEPFM)
  assert spec == {"embedding": {"dims": [8]}, "dense": {"linear": True, "bottom_mlp": None},
                  "bias": False, "combine": "parallel",
                  "interactions": [{"type": "fm", "pairs": None}, {"type": "first_order"}],
                  "tower": {"dims": [16], "inputs": ["embeddings", "dense"]}}
  text = block_spec.spec_to_json(DEEPFM)
  assert text == block_spec.spec_to_json(json.loads(text))
  assert list(json.loads(text)) == sorted(json.loads(text))
  assert block_spec.spec_from_json(text) == spec
  assert block_spec.spec_embedding_width(DEEPFM) == 9
  assert block_spec.spec_embedding_width({"embedding": {"dims": [4, 6]}}) == 6


@pytest.mark.parametrize("text,where", [
    ("{", "not valid JSON"),
    ("[]", "<spec>: must be an object"),
    ('{"embedding": {"dims": [4]}, "towr": null}', "<spec>: unknown key 'towr'"),
    ('{"dense": {}}', "embedding: missing"),
    ('{"embedding": {"dims": []}}', "embedding.dims: must not be empty"),
    ('{"embedding": {"dims": [4]}, "interactions": [{"type": "cross", "layers": -1}]}',
     "interactions[0].layers: must be an int"),
    ('{"embedding": {"dims": [4]}, "interactions": [{"type": "cross", "rnk": 2}]}',
     "interactions[0]: unknown key 'rnk'"),
    ('{"embedding": {"dims": [4]}, "interactions": [{"type": "pnn"}]}',
     "interactions[0].type: unknown block type 'pnn'"),
    ('{"embedding": {"dims": [4]}, "interactions": [{"type": "fm", "pairs": [[2, 1]]}]}',
     "interactions[0].pairs[0]: needs i < j"),
    ('{"embedding": {"dims": [4]}, "interactions": [{"type": "fm", "pairs": [[0, 1], [0, 1]]}]}',
     "appears twice"),
    ('{"embedding": {"dims": [0]}, "interactions": [{"type": "first_order"}, {"type": "fm"}]}',
     "interactions[1].type: fm needs field vectors"),
    ('{"embedding": {"dims": [0]}}', "rows would be empty"),
    ('{"embedding": {"dims": [4]}, "combine": "stacked", "tower": {"dims": [4]}}',
     "needs at least one block"),
    ('{"embedding": {"dims": [4]}, "tower": {"inputs": ["blocks"]}}', "tower.inputs"),
    ('{"embedding": {"dims": [4]}, "tower": {"inputs": ["dense", "dense"]}}', "tower.inputs[1]"),
    ('{"embedding": {"dims": [4]}, "bias": 1}', "bias: must be true or false"),
    ('{"embedding": {"dims": [4]}, "interactions": [{"type": ["fm"]}]}', "unknown block type"),
    ('{"embedding": {"dims": [4.0]}}', "embedding.dims[0]"),
])
def test_bad_specs_name_the_field_and_key(text, where):
  with pytest.raises(SpecError) as e:
    block_spec.spec_from_json(text, field="step.autofis.blocks")
  assert str(e.value).startswith("step.autofis.blocks: ") and where in str(e.value)


def test_non_text_and_empty_specs_are_errors():
  with pytest.raises(SpecError, match="model.blocks: must be JSON text"):
    block_spec.spec_from_json(3)
  with pytest.raises(SpecError, match="model.blocks: empty"):
    block_spec.spec_from_json("  ")


def test_with_interaction_pairs_restricts_only_the_pairwise_blocks():
  spec = {"embedding": {"dims": [4]}, "interactions": [
      {"type": "fm"}, {"type": "inner_product"}, {"type": "gated_pairs", "pairs": [[0, 1]]},
      {"type": "cross", "layers": 1}]}
  out = block_spec.with_interaction_pairs(spec, [(2, 3), (0, 2)])
  assert [b.get("pairs") for b in out["interactions"]] == [[[0, 2], [2, 3]]] * 3 + [None]
  assert out["interactions"][3] == {"type": "cross", "layers": 1, "rank": 0}
  with pytest.raises(SpecError, match=r"pairs\[0\]: needs i < j"):
    block_spec.with_interaction_pairs(spec, [(3, 3)])


def test_gated_is_a_parallel_flag_emitted_only_when_true():
  text = block_spec.spec_to_json(DEEPFM)
  assert block_spec.spec_to_json({**DEEPFM, "gated": False}) == text  # same digest as before
  assert "gated" not in block_spec.validate_spec(DEEPFM)
  gated = block_spec.validate_spec({**DEEPFM, "gated": True})
  assert gated["gated"] is True and block_spec.spec_from_json(json.dumps(gated)) == gated
  with pytest.raises(SpecError, match="model.blocks: gated: must be true or false"):
    block_spec.validate_spec({**DEEPFM, "gated": 1})
  stacked = {**DEEPFM, "combine": "stacked", "tower": {"dims": [4], "inputs": ["blocks"]}}
  with pytest.raises(SpecError, match="gated: only a parallel model"):
    block_spec.validate_spec({**stacked, "gated": True})


def test_gated_columns_is_a_flag_emitted_only_when_true():
  text = block_spec.spec_to_json(DEEPFM)
  assert block_spec.spec_to_json({**DEEPFM, "gated_columns": False}) == text
  stacked = {**DEEPFM, "combine": "stacked", "tower": {"dims": [4], "inputs": ["blocks"]}}
  gated = block_spec.validate_spec({**stacked, "gated_columns": True})
  assert gated["gated_columns"] is True and block_spec.spec_from_json(json.dumps(gated)) == gated
  with pytest.raises(SpecError, match="model.blocks: gated_columns: must be true or false"):
    block_spec.validate_spec({**DEEPFM, "gated_columns": "yes"})
