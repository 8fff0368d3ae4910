"""Checkpoints of runs over several processes, restored on another process count, and
every row optimizer over two processes, each against the uninterrupted 1-device run.

One launch of two Python processes x 4 fake CPU devices (gloo on loopback) runs a
list of jobs in turn, so compilation and start-up are paid once:

  ckpt2     cache backend, checkpoints every 6 steps (12 steps)   -> equals the reference
  (copy)    process 0 copies its workdir truncated to step 6 three times; a barrier
  fail      resumes one copy; process 1 cannot write its shard of step 12 -> both raise,
            step 6 stays the intact last checkpoint
  resume22  2 processes resume the 2-process checkpoint of step 6  -> equals the reference
  resume12  2 processes resume a 1-process cache checkpoint        -> equals the reference
  dev12     2 processes resume a 1-process device-backend one      -> equals the reference
  row2      the row-sharded cache over both processes' 8 devices (128 rows each,
            evicting), checkpoints                                 -> equals the reference
  opt_<o>   cache backend with row optimizer o (not adagrad)       -> equals o's reference

After it, this process resumes the second copy (2 -> 1 processes).
"""

import json
import os
import shutil
import textwrap

import chex
import numpy as np
import pytest

from experiments.configs import ctr
from sfjax.checkpoint import checkpointer as checkpoint
from sfjax.checkpoint import export
from sfjax.data import dataset as dataset_lib
from sfjax.embedding import row_optimizers
from sfjax.train import loop
from tests.parallel import two_processes  # launches two jax.distributed processes

_STEPS, _CUT = 12, 6  # the copies resume from step _CUT's checkpoint
_OPTIMIZERS = tuple(o for o in row_optimizers.ROW_OPTIMIZER_NAMES if o != "adagrad")
_TOL = dict(rtol=1e-4, atol=1e-5)
_TABLE_TOL = dict(rtol=1e-3, atol=1e-4)


def _config(optimizer="adagrad", backend="cache", every=0):
  c = ctr.get_config("smoke")
  c.data.synthetic.num_train, c.data.synthetic.num_eval = 2048, 512
  c.model.mlp_dims, c.model.embed_dim = (16,), 4
  c.embedding.optimizer, c.embedding.learning_rate, c.embedding.l2 = optimizer, 0.1, 1e-4
  c.embedding.backend, c.embedding.cache_rows = backend, 1700.0
  c.train.steps, c.train.batch_size, c.train.eval_every, c.train.log_every = _STEPS, 32, 6, 100
  c.train.eval_batch_size, c.train.num_devices = 256, 1
  c.checkpoint.every_steps, c.checkpoint.keep = every, 4
  return c


def _truncate_copy(src: str, dst: str, upto: int) -> None:
  """`src` copied to `dst` without the checkpoints after step `upto` (an interrupted run)."""
  shutil.copytree(src, dst)
  root = os.path.join(dst, checkpoint.CHECKPOINT_DIR)
  for step in checkpoint.committed_steps(root):
    if step > upto:
      shutil.rmtree(os.path.join(root, checkpoint.step_dir_name(step)))


# One process of the launch: joins, then runs each job through the library (as
# experiments/train_ctr.py does) and saves its losses, metrics and its rows of the table.
_WORKER = textwrap.dedent("""
    import json, os, shutil, time
    import numpy as np
    from sfjax.parallel import distributed
    from tests.parallel import two_processes
    jobs, pid = two_processes.join_run(lambda jobs: {}, initialize=False)[1:3]
    for job in jobs:
      t0 = time.time()
      if "copy" in job:  # process 0 copies, truncated; every process waits (a barrier)
        from sfjax.checkpoint import checkpointer as checkpoint
        if pid == 0:
          for dst in job["copy"]["to"]:
            shutil.copytree(job["copy"]["from"], dst)
            root = os.path.join(dst, checkpoint.CHECKPOINT_DIR)
            for step in checkpoint.committed_steps(root):
              if step > job["copy"]["upto"]:
                shutil.rmtree(os.path.join(root, checkpoint.step_dir_name(step)))
        assert not distributed.failed_processes(True)
        continue
      c, _, pid, out, _ = two_processes.join_run(lambda jobs, job=job: job["cfg"])
      import jax
      from sfjax.data import dataset as dataset_lib
      from sfjax.train import loop
      assert jax.device_count() == 8 and jax.local_device_count() == 4
      losses = []
      data = dataset_lib.make_dataset(c.data, c.seed)
      trainer = loop.build_trainer(c, data.spec)
      name = job["name"] + f"_p{pid}"
      if job.get("fail_on") == pid:  # this process's table shard cannot be written
        from sfjax.checkpoint import table_format as table_checkpoint
        def broken(*args, **kwargs):
          raise OSError("injected: disk full")
        real, table_checkpoint.write_table = table_checkpoint.write_table, broken
      try:
        final, state = loop.train_and_evaluate(c, job["workdir"], dataset=data, trainer=trainer,
                                               loss_log=losses)
      except Exception as err:
        if "fail_on" not in job:
          raise
        with open(os.path.join(out, name + ".err"), "w") as f:
          f.write(f"{type(err).__name__}: {err}")
        continue
      finally:
        if job.get("fail_on") == pid:
          table_checkpoint.write_table = real
      host = trainer.backend.host_table
      if host is None:  # device backend: the whole table, replicated
        ids = np.arange(state.table.values.shape[0])
        values, slots = np.asarray(state.table.values), np.asarray(state.table.opt_slots)
      else:  # cache backend: this process's rows of the host table (id % 2 == pid)
        ids = np.arange(pid, host.num_rows, 2)
        values, slots = host.gather(ids)
      np.savez(os.path.join(out, name + ".npz"), losses=np.asarray(losses), ids=ids,
               values=values, slots=slots)
      with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump(final, f)
      print(f"job {name}: {time.time() - t0:.1f} s", flush=True)
""")


def _launch(jobs: list, out_dir, timeout=300) -> list[str]:
  return two_processes.launch(_WORKER, json.dumps(jobs), out_dir, timeout)


def _reference(optimizer="adagrad"):
  """The uninterrupted 1-device run (device backend): (losses, final, values, slots)."""
  c = _config(optimizer, backend="device")
  losses = []
  final, state = loop.train_and_evaluate(c, dataset=dataset_lib.make_dataset(c.data, c.seed),
                                         loss_log=losses)
  return (np.asarray(losses), final, np.asarray(state.table.values),
          np.asarray(state.table.opt_slots))


def _one_process(c, workdir):
  """A run in this process; (losses, final, values [V,E], slots [V,S]) of the whole table."""
  losses = []
  data = dataset_lib.make_dataset(c.data, c.seed)
  trainer = loop.build_trainer(c, data.spec)
  final, state = loop.train_and_evaluate(c, workdir, dataset=data, trainer=trainer,
                                         loss_log=losses)
  if trainer.backend.host_table is None:
    return (np.asarray(losses), final, np.asarray(state.table.values),
            np.asarray(state.table.opt_slots))
  values, slots = trainer.backend.host_table.read_all()
  return np.asarray(losses), final, values, slots


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
  """Runs the launch once; returns (out dir, references by optimizer, work dirs)."""
  tmp = tmp_path_factory.mktemp("two_processes")
  refs = {o: _reference(o) for o in ("adagrad",) + _OPTIMIZERS}
  dirs = {k: str(tmp / k) for k in ("w1", "w1c", "d1", "d1c", "w2", "w2a", "w2b", "w2c",
                                        "w_row")}
  for name, backend in (("w1", "cache"), ("d1", "device")):  # 1-process checkpoints
    _one_process(_config(backend=backend, every=6), dirs[name])
    _truncate_copy(dirs[name], dirs[name + "c"], _CUT)
  jobs = [{"name": "ckpt2", "cfg": two_processes.flat_config(_config(every=6)), "workdir": dirs["w2"]},
          {"copy": {"from": dirs["w2"], "to": [dirs["w2a"], dirs["w2b"], dirs["w2c"]],
                    "upto": _CUT}},
          {"name": "fail", "cfg": two_processes.flat_config(_config(every=6)), "workdir": dirs["w2c"], "fail_on": 1},
          {"name": "resume22", "cfg": two_processes.flat_config(_config(every=6)), "workdir": dirs["w2a"]},
          {"name": "resume12", "cfg": two_processes.flat_config(_config(every=6)), "workdir": dirs["w1c"]},
          {"name": "dev12", "cfg": two_processes.flat_config(_config(backend="device", every=6)),
           "workdir": dirs["d1c"]}]
  row = _config(every=6)
  row.embedding.cache_sharding, row.embedding.cache_rows = "row", 128.0  # per device: 1024 in all
  row.embedding.unique_capacity = 512  # (~280 unique rows a step): the cache evicts
  jobs.append({"name": "row2", "cfg": two_processes.flat_config(row), "workdir": dirs["w_row"]})
  jobs += [{"name": f"opt_{o}", "cfg": two_processes.flat_config(_config(o)), "workdir": None} for o in _OPTIMIZERS]
  out = tmp / "out"
  out.mkdir()
  _launch(jobs, out)
  return out, refs, dirs


def _check_job(out, name, ref, first_step=1):
  """Both processes' losses (from `first_step`), metrics and table rows equal `ref`'s."""
  ref_losses, ref_final, ref_values, ref_slots = ref
  finals = []
  for pid in (0, 1):
    run = np.load(out / f"{name}_p{pid}.npz")
    final = json.loads((out / f"{name}_p{pid}.json").read_text())
    chex.assert_trees_all_close(run["losses"], ref_losses[first_step - 1:], **_TOL)
    chex.assert_trees_all_close(run["values"], ref_values[run["ids"]], **_TABLE_TOL)
    chex.assert_trees_all_close(run["slots"], ref_slots[run["ids"]], **_TABLE_TOL)
    for key in ("auc", "logloss", "eval_auc", "eval_logloss"):
      np.testing.assert_allclose(final[key], ref_final[key], rtol=1e-4, err_msg=f"{name} {key}")
    assert final["num_processes"] == 2
    finals.append(final)
  assert finals[0]["auc"] == finals[1]["auc"]


def _meta(workdir, step):
  return checkpoint.read_meta(os.path.join(workdir, checkpoint.CHECKPOINT_DIR,
                                           checkpoint.step_dir_name(step)))


def test_two_process_checkpoints_leave_the_run_unchanged_and_hold_two_shards(launch):
  out, refs, dirs = launch
  _check_job(out, "ckpt2", refs["adagrad"])
  ids = [np.load(out / f"ckpt2_p{pid}.npz")["ids"] for pid in (0, 1)]
  # each process owns (and wrote back) its half of the host rows
  assert np.intersect1d(*ids).size == 0 and ids[0].size + ids[1].size == refs["adagrad"][2].shape[0]
  records = [json.loads(line) for line in open(os.path.join(dirs["w2"], "metrics.jsonl"))]
  assert [r["step"] for r in records] == [6, 12]  # process 0 writes the workdir
  np.testing.assert_allclose(records[-1]["auc"], refs["adagrad"][1]["auc"], rtol=1e-4)
  root = os.path.join(dirs["w2"], checkpoint.CHECKPOINT_DIR)
  assert checkpoint.committed_steps(root) == [6, 12]
  meta = checkpoint.verify(os.path.join(root, checkpoint.step_dir_name(12)))
  assert meta["processes"] == 2 and meta["table"] == "host_shards"
  assert sorted(os.listdir(os.path.join(root, checkpoint.step_dir_name(12), "table"))) == [
      "process_0_of_2", "process_1_of_2"]
  assert not [n for n in os.listdir(root) if n.startswith("tmp.")]


def test_a_two_process_checkpoint_exports_the_whole_table(launch, tmp_path):
  _, refs, dirs = launch
  export.export_checkpoint(dirs["w2"], str(tmp_path / "export"))
  manifest, values, slots = export.read_export(str(tmp_path / "export"))
  _, _, ref_values, ref_slots = refs["adagrad"]
  assert manifest["step"] == 12
  chex.assert_trees_all_close((values, slots), (ref_values, ref_slots), **_TABLE_TOL)


def test_two_processes_resume_a_two_process_checkpoint(launch):
  out, refs, dirs = launch
  _check_job(out, "resume22", refs["adagrad"], first_step=_CUT + 1)
  assert _meta(dirs["w2a"], 12)["processes"] == 2
  records = [json.loads(line) for line in open(os.path.join(dirs["w2a"], "metrics.jsonl"))]
  assert [r["step"] for r in records] == [6, 12]


def test_one_process_resumes_a_two_process_checkpoint(launch):
  _, refs, dirs = launch
  losses, final, values, slots = _one_process(_config(every=6), dirs["w2b"])
  ref_losses, ref_final, ref_values, ref_slots = refs["adagrad"]
  chex.assert_trees_all_close(losses, ref_losses[_CUT:], **_TOL)
  chex.assert_trees_all_close((values, slots), (ref_values, ref_slots), **_TABLE_TOL)
  np.testing.assert_allclose(final["auc"], ref_final["auc"], rtol=1e-4)
  meta = _meta(dirs["w2b"], 12)
  assert meta["processes"] == 1 and meta["table"] == "host_chunks"


@pytest.mark.parametrize("job,workdir", [("resume12", "w1c"), ("dev12", "d1c")])
def test_two_processes_resume_a_one_process_checkpoint(launch, job, workdir):
  out, refs, dirs = launch
  _check_job(out, job, refs["adagrad"], first_step=_CUT + 1)
  assert _meta(dirs[workdir], 12)["processes"] == 2


@pytest.mark.parametrize("optimizer", _OPTIMIZERS)
def test_every_row_optimizer_on_two_processes_matches_one_device(launch, optimizer):
  out, refs, _ = launch
  _check_job(out, f"opt_{optimizer}", refs[optimizer])


def test_a_failed_shard_write_fails_the_save_everywhere_and_keeps_the_last_good_one(launch):
  out, _, dirs = launch
  root = os.path.join(dirs["w2c"], checkpoint.CHECKPOINT_DIR)
  for pid in (0, 1):
    err = (out / f"fail_p{pid}.err").read_text()
    assert err.startswith("CheckpointSaveError: checkpoint step_00000012 was not saved"), err
    assert "failed on processes [1]" in err and "step_00000006" in err
  assert "injected: disk full" in (out / "fail_p1.err").read_text()
  assert checkpoint.committed_steps(root) == [_CUT]
  assert sorted(os.listdir(root)) == [checkpoint.step_dir_name(_CUT)]  # no tmp.* left over
  assert checkpoint.verify(os.path.join(root, checkpoint.step_dir_name(_CUT)))["processes"] == 2


def test_a_missing_shard_is_named_and_the_previous_checkpoint_resumes(launch, tmp_path):
  _, _, dirs = launch
  work = str(tmp_path / "w")
  shutil.copytree(dirs["w2"], work)
  root = os.path.join(work, checkpoint.CHECKPOINT_DIR)
  newest = os.path.join(root, checkpoint.step_dir_name(_STEPS))
  shutil.rmtree(os.path.join(newest, "table", "process_1_of_2"))
  with pytest.raises(checkpoint.CorruptCheckpointError,
                     match=r"process_1_of_2/manifest\.json: unreadable checkpoint file"):
    checkpoint.verify(newest)
  assert checkpoint.find_resumable(root) == os.path.join(root, checkpoint.step_dir_name(_CUT))
  assert os.path.isdir(os.path.join(root, "corrupt." + checkpoint.step_dir_name(_STEPS)))


def test_the_row_sharded_cache_over_two_processes_matches_one_device(launch):
  out, refs, dirs = launch
  _check_job(out, "row2", refs["adagrad"])
  final = json.loads((out / "row2_p0.json").read_text())
  assert final["cache_sharding"] == "row" and final["cache_capacity_rows"] == 8 * 128
  assert final["evictions"] > 0  # rows left devices owned by either process and came back
  assert _meta(dirs["w_row"], _STEPS)["processes"] == 2
