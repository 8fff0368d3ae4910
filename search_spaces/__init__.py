"""Concrete search spaces built with `sfjax.automl.space` (CTR models, ...)."""

from search_spaces import default
from search_spaces.blocks import BLOCK_SEARCH_SPACE, preset_config
from search_spaces.ctr import (
                               SEARCH_SPACE,
                               arch_part,
                               ctr_space,
                               default_config,
                               fixed_arch_space,
                               hparam_space,
                               runner_config,
)

# The default CTR space (`search_spaces/default.py`): generated models, the named ones its
# presets; the named-family space when `space.families` names any.
DEFAULT_SEARCH_SPACE = default.SEARCH_SPACE
# The spaces a pipeline or search config may name (`steps.<name>.search_space`): 'ctr' is
# the default space above; 'blocks' the block generator's alone; 'families' the named
# families' alone (`search_spaces.ctr.SEARCH_SPACE`).
SPACES = {"ctr": DEFAULT_SEARCH_SPACE, "blocks": BLOCK_SEARCH_SPACE, "families": SEARCH_SPACE}

__all__ = ["BLOCK_SEARCH_SPACE", "DEFAULT_SEARCH_SPACE", "SEARCH_SPACE", "SPACES", "arch_part",
           "ctr_space", "default_config", "fixed_arch_space", "hparam_space", "preset_config",
           "runner_config"]
