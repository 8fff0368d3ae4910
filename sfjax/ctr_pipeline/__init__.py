"""sfjax.ctr_pipeline: VEGA's CTR pipeline on the generic engine (`sfjax.automl.pipeline`).

Its steps (NAS, HPO, AutoFIS/AutoGroup, fully train, baseline, compress) and
`run_ctr_pipeline`, the one wiring the CLI and the notebooks call.
"""

from sfjax.ctr_pipeline.run import ctr_finalizer, ctr_pipeline_parts, run_ctr_pipeline

__all__ = ["ctr_finalizer", "ctr_pipeline_parts", "run_ctr_pipeline"]
