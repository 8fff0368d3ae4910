"""Per-process input (issue #24): 2 (and, slow, 4) local `jax.distributed` processes train
on preprocessed shards exactly as one process does, while each reads only its own rows of
every global batch: the reader's instrumented counter (`rows_read`) and the indices each
process read show the reads disjoint and complete. The run checkpoints and a second
launch resumes it by seeking (the saved input position) to the same end.

(The fast tier's 2-process runs, tests/parallel/distributed_test.py and
multiprocess_checkpoint_test.py, train on synthetic data, which is read per process too.)
"""

import json
import textwrap

import chex
import numpy as np
import pytest

from experiments.configs import ctr
from sfjax.data import dataset as dataset_lib
from sfjax.data import preprocessed
from sfjax.data.generated import synthetic
from sfjax.train import loop
from tests.parallel import two_processes

_STEPS, _BATCH = 12, 32

# One process: trains (recording the indices its reader was asked for), saves its losses,
# metrics, the replicated table and what it read.
_WORKER = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    cfg_json, port, pid, out, count = (sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4],
                                       int(sys.argv[5]))
    from experiments.configs import ctr
    from sfjax.parallel import distributed
    c = ctr.get_config("smoke")
    c.update_from_flattened_dict(json.loads(cfg_json))
    c.distributed.coordinator = "127.0.0.1:" + port
    c.distributed.num_processes, c.distributed.process_id = count, pid
    assert distributed.initialize_distributed(c) == count
    from sfjax.data import dataset as dataset_lib
    from sfjax.train import loop
    for name in ("first", "resumed"):  # the second run resumes step 6's checkpoint by seeking
      if name == "resumed":
        if pid == 0:  # the run as if killed after step 6: its last checkpoint goes
          from sfjax.checkpoint import checkpointer as checkpoint
          import shutil
          shutil.rmtree(os.path.join(out, "work", checkpoint.CHECKPOINT_DIR,
                                     checkpoint.step_dir_name(12)))
        assert not distributed.failed_processes(True)  # a barrier
      data = dataset_lib.make_dataset(c.data, c.seed)
      seen, real = [], data.read_train
      def read(indices, real=real, seen=seen):  # instrumentation around the real reader
        seen.append(np.asarray(indices).copy())
        return real(indices)
      data.read_train = read
      losses = []
      final, state = loop.train_and_evaluate(c, os.path.join(out, "work"), dataset=data,
                                             loss_log=losses)
      np.savez(os.path.join(out, f"{name}_p{pid}.npz"), losses=np.asarray(losses),
               values=np.asarray(state.table.values), seen=np.stack(seen),
               rows_read=data.stats["rows_read"])
      with open(os.path.join(out, f"{name}_p{pid}.json"), "w") as f:
        json.dump(final, f)
""")


def _run(count: int, payload: str, out_dir, timeout: int) -> None:
  """`count` worker processes of one jax.distributed job on loopback, 8/count CPU devices
  each; every one must exit 0 within `timeout` s (else all are killed and the test fails)."""
  two_processes.launch(_WORKER, payload, out_dir, timeout, devices=8 // count, count=count)


@pytest.fixture(scope="module")
def shards_dir(tmp_path_factory):
  """A preprocessed data set: 1,500 Criteo-like rows in 4 shards, 300 eval rows."""
  root = tmp_path_factory.mktemp("per_process_input")
  gen = synthetic.SyntheticCTR(ctr.get_config("smoke").data.synthetic, seed=0)
  gen.write_criteo(str(root / "train.tsv"), "train", 1500)
  gen.write_criteo(str(root / "eval.tsv"), "eval", 300)
  d = ctr.get_config().data
  d.format, d.train_path, d.eval_path = "criteo", str(root / "train.tsv"), str(root / "eval.tsv")
  d.hash_rows, d.shuffle_buffer = 2000, 0
  preprocessed.preprocess_files(d, str(root / "pre"), rows_per_shard=400)
  return root / "pre"


def _config(shards_dir):
  c = ctr.get_config("smoke")
  c.data.format, c.data.train_path, c.data.shuffle_buffer = "preprocessed", str(shards_dir), 300
  c.model.mlp_dims, c.model.embed_dim = (16,), 4
  c.embedding.learning_rate = 0.1
  c.train.steps, c.train.batch_size, c.train.eval_every, c.train.log_every = _STEPS, _BATCH, 6, 100
  c.train.eval_batch_size, c.train.num_devices, c.train.prefetch = 64, 1, 2
  c.checkpoint.every_steps = 6
  return c


def _check(count, shards_dir, out):
  c = _config(shards_dir)
  data = dataset_lib.make_dataset(c.data, c.seed)
  ref_losses = []
  ref_final, ref_state = loop.train_and_evaluate(c, dataset=data, loss_log=ref_losses)
  order = data.train_order(_BATCH, c.seed)
  ref_batches = np.stack([order.next_batch() for _ in range(_STEPS)])  # [steps, B]
  _run(count, json.dumps(two_processes.flat_config(c)), out, timeout=150 + 60 * count)
  share = _BATCH // count
  for name, first in (("first", 0), ("resumed", 6)):
    last = _STEPS
    runs = [np.load(out / f"{name}_p{p}.npz") for p in range(count)]
    finals = [json.loads((out / f"{name}_p{p}.json").read_text()) for p in range(count)]
    for p, run in enumerate(runs):
      chex.assert_trees_all_close(run["losses"], np.asarray(ref_losses[first:last]),
                                  rtol=1e-4, atol=1e-5)
      seen = run["seen"]  # [batches read (the feed may run ahead), B/P]
      assert seen.shape[1] == share and int(run["rows_read"]) == seen.size
      # Process p read exactly its rows of each global batch: disjoint, and together complete.
      np.testing.assert_array_equal(seen[:last - first],
                                    ref_batches[first:last, p * share:(p + 1) * share])
      # (resumed: its first read is batch 6's rows: the run started at the saved position)
      chex.assert_trees_all_close(run["values"], np.asarray(ref_state.table.values),
                                  rtol=1e-3, atol=1e-4)
      for key in ("auc", "logloss"):
        np.testing.assert_allclose(finals[p][key], ref_final[key], rtol=1e-4, err_msg=key)


@pytest.mark.slow  # ~17 s on a quiet machine (two process start-ups + a 1-process reference)
@pytest.mark.timeout(400)
def test_two_processes_read_disjoint_halves_and_train_as_one(shards_dir, tmp_path):
  _check(2, shards_dir, tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_four_processes_read_disjoint_quarters_and_train_as_one(shards_dir, tmp_path):
  _check(4, shards_dir, tmp_path)
