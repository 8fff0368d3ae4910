"""sfjax.checkpoint: saving, verifying, restoring and exporting a run's state.

The on-disk layout and its checks (`layout`), the table's chunked format
(`table_format`) and per-process shards (`table_shards`), the trainer's
checkpointer (orbax dense state + CRC-checked host-table chunks) and the
numpy-readable export.
"""
