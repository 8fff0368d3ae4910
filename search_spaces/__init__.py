"""Concrete search spaces built with `sfjax.automl.space` (CTR models, ...)."""

from search_spaces.ctr import (arch_part, ctr_space, default_config, fixed_arch_space,
                               hparam_space, runner_config)

__all__ = ["arch_part", "ctr_space", "default_config", "fixed_arch_space", "hparam_space",
           "runner_config"]
