"""sfjax.structure: structure search on CTR models.

AutoFIS (gated feature interactions trained with gRDA, then pruned and retrained)
and AutoGroup (learned feature groups), both on the cohorts' trial task; their
models are registered in `sfjax.models` and train through the shared train step
(`gate_training`).
"""
