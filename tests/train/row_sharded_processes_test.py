"""The row-sharded device table over two `jax.distributed` processes x 4 devices.

Each process holds the rows of its own 4 devices (4227 of the 33812 rows each), puts
only its devices' per-owner row blocks and its own examples, and the run equals the
one-device reference (losses, table rows and slots, eval AUC; float tolerance). Its
checkpoint, saved by both processes, resumes on one device to the same end.
"""

import json
import shutil
import textwrap

import chex
import numpy as np
import pytest

from sfjax.checkpoint import checkpointer as checkpoint
from sfjax.data import dataset as dataset_lib
from sfjax.train import loop
from tests.parallel import two_processes  # launches two jax.distributed processes
from tests.train import device_backend_test as dbt
from tests.train import training_runs

# One process: trains row-sharded, then gathers the whole table (every process's shards)
# to compare it in row order.
_WORKER = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    cfg_json, port, pid, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    from experiments.configs import ctr
    from sfjax.parallel import distributed
    c = ctr.get_config("smoke")
    c.update_from_flattened_dict(json.loads(cfg_json))
    c.distributed.coordinator = "127.0.0.1:" + port
    c.distributed.num_processes, c.distributed.process_id = 2, pid
    assert distributed.initialize_distributed(c) == 2
    import jax
    from jax.experimental import multihost_utils
    from sfjax.data import dataset as dataset_lib
    from sfjax.embedding import row_sharded_table
    from sfjax.train import loop
    losses = []
    data = dataset_lib.make_dataset(c.data, c.seed)
    trainer = loop.build_trainer(c, data.spec)
    final, state = loop.train_and_evaluate(c, dataset=data, trainer=trainer, loss_log=losses)
    own = [s.data.shape[0] for s in state.table.values.addressable_shards]
    layout = trainer.backend.layout
    values, slots = (row_sharded_table.to_logical(
        np.asarray(multihost_utils.process_allgather(x, tiled=True)), layout,
        trainer.backend.num_rows) for x in state.table)
    np.savez(os.path.join(out, f"p{pid}.npz"), losses=np.asarray(losses), values=values,
             slots=slots, own=np.asarray(own))
    with open(os.path.join(out, f"p{pid}.json"), "w") as f:
      json.dump(final, f)
""")


@pytest.mark.timeout(300)
def test_two_processes_row_sharded_equal_one_device(tmp_path):
  config = dbt._config(devices=1, sharding="replicated", steps=12)
  ref_final, ref_state, trainer, losses = training_runs.train_run(config)
  config.embedding.sharding = "row"
  two_processes.launch(_WORKER, json.dumps(two_processes.flat_config(config)), tmp_path, 240)
  tol = dict(rtol=1e-4, atol=1e-4)
  for pid in (0, 1):
    run = np.load(tmp_path / f"p{pid}.npz")
    final = json.loads((tmp_path / f"p{pid}.json").read_text())
    assert run["own"].tolist() == [-(-33812 // 8)] * 4  # 4 devices' rows, not the table
    chex.assert_trees_all_close(run["losses"], np.asarray(losses), **tol)
    chex.assert_trees_all_close((run["values"], run["slots"]),
                                tuple(trainer.backend.table_rows(ref_state)), **tol)
    assert (final["num_processes"], final["num_devices"], final["cache_sharding"]) == (2, 8, "row")
    np.testing.assert_allclose(final["auc"], ref_final["auc"], rtol=1e-4)


# One process: trains row-sharded with checkpoints at steps 12 and 24 in `out/work`.
_SAVING_WORKER = textwrap.dedent("""
    import json, os, sys
    cfg_json, port, pid, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    from experiments.configs import ctr
    from sfjax.parallel import distributed
    c = ctr.get_config("smoke")
    c.update_from_flattened_dict(json.loads(cfg_json))
    c.distributed.coordinator = "127.0.0.1:" + port
    c.distributed.num_processes, c.distributed.process_id = 2, pid
    assert distributed.initialize_distributed(c) == 2
    from sfjax.data import dataset as dataset_lib
    from sfjax.train import loop
    data = dataset_lib.make_dataset(c.data, c.seed)
    loop.train_and_evaluate(c, os.path.join(out, "work"), dataset=data)
""")


@pytest.mark.timeout(300)
def test_a_two_process_row_sharded_checkpoint_resumes_on_one_device(tmp_path):
  config = dbt._config(devices=1, sharding="replicated", steps=24)
  config.checkpoint.every_steps, config.checkpoint.keep = 12, 2
  ref_final, ref_state, trainer, losses = training_runs.train_run(config)
  saved = config.copy_and_resolve_references()
  saved.embedding.sharding = "row"
  two_processes.launch(_SAVING_WORKER, json.dumps(two_processes.flat_config(saved)), tmp_path,
                       240)
  work = tmp_path / "work"
  shutil.rmtree(work / checkpoint.CHECKPOINT_DIR / checkpoint.step_dir_name(24))
  data = dataset_lib.make_dataset(config.data, config.seed)
  resumed_trainer = loop.build_trainer(config, data.spec)  # 1 device, the table replicated
  resumed_losses = []
  final, state = loop.train_and_evaluate(config, str(work), dataset=data,
                                         trainer=resumed_trainer, loss_log=resumed_losses)
  tol = dict(rtol=1e-4, atol=1e-4)
  chex.assert_trees_all_close(np.asarray(resumed_losses), np.asarray(losses[12:]), **tol)
  chex.assert_trees_all_close(tuple(resumed_trainer.backend.table_rows(state)),
                              tuple(trainer.backend.table_rows(ref_state)), **tol)
  np.testing.assert_allclose(final["auc"], ref_final["auc"], rtol=1e-4)
