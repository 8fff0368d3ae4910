"""sfjax.checkpoint: saving, verifying, reading, restoring and exporting a run's state.

  open_checkpoint(path) -> Checkpoint    read a run's checkpoint (dense params, optimizer
                                         state, the table of either backend) without it
  Checkpointer                           the trainer's crash-safe saves and restores
  export_checkpoint(workdir, out_dir)    the table as numpy-readable `.npy` chunks
  save_table(ChangeTracker(table), dir, previous) / load_table(table, dir)
                                         one host table's checkpoint, without a trainer

Modules: the on-disk layout and its checks (`layout`), the table's chunked format and
how it is written (`table_format`), read (`table_reader`) and sharded per process
(`table_shards`), what changed since a checkpoint (`change_tracking`), reads that retry a
transient error (`read_retry`), the reader (`reader`), the checkpointer (`checkpointer`)
and the export (`export`).
"""

from sfjax.checkpoint.change_tracking import ChangeTracker
from sfjax.checkpoint.checkpointer import (
  Checkpointer,
  CheckpointSaveError,
  Restored,
  checkpoint_settings,
)
from sfjax.checkpoint.export import export_checkpoint, read_export
from sfjax.checkpoint.layout import (
  CHECKPOINT_DIR,
  CorruptCheckpointError,
  committed_steps,
  find_resumable,
  verify,
)
from sfjax.checkpoint.read_retry import CheckpointReadError
from sfjax.checkpoint.reader import (
  Checkpoint,
  CheckpointTable,
  open_checkpoint,
  with_empty_leaves,
)
from sfjax.checkpoint.table_format import save_table
from sfjax.checkpoint.table_reader import load_table

__all__ = ["CHECKPOINT_DIR", "ChangeTracker", "Checkpoint", "CheckpointReadError",
           "CheckpointSaveError", "CheckpointTable", "Checkpointer", "CorruptCheckpointError",
           "Restored", "checkpoint_settings", "committed_steps", "export_checkpoint",
           "find_resumable", "load_table", "open_checkpoint", "read_export", "save_table",
           "verify", "with_empty_leaves"]
