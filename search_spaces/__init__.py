"""Concrete search spaces built with `sfjax.automl.space` (CTR models, ...)."""

from search_spaces.blocks import BLOCK_SEARCH_SPACE
from search_spaces.ctr import (
                               SEARCH_SPACE,
                               arch_part,
                               ctr_space,
                               default_config,
                               fixed_arch_space,
                               hparam_space,
                               runner_config,
)

# The spaces a pipeline or search config may name (`steps.<name>.search_space`): the named
# model families, or the block generator's composable models.
SPACES = {"ctr": SEARCH_SPACE, "blocks": BLOCK_SEARCH_SPACE}

__all__ = ["BLOCK_SEARCH_SPACE", "SEARCH_SPACE", "SPACES", "arch_part", "ctr_space",
           "default_config", "fixed_arch_space", "hparam_space", "runner_config"]
