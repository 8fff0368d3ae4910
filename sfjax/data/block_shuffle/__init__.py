"""The block shuffle of preprocessed shards (`data.shuffle=block`): its order and its reader."""

from sfjax.data.block_shuffle.order import BLOCK_STREAM, BlockOrder
from sfjax.data.block_shuffle.reader import GROUP_ROWS, BlockReader

__all__ = ["BLOCK_STREAM", "GROUP_ROWS", "BlockOrder", "BlockReader"]
