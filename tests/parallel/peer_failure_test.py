"""A process of two killed (SIGKILL) mid-step or mid-checkpoint: the survivor ends within
`distributed.timeout_s` (+ a margin) with an error naming the dead process and the
phase, and relaunching both resumes from the last checkpoint to the uninterrupted
run's result (issue #24, Deliver 5). Also: a timed barrier over two processes names
the process that did not come.

Each launch is two Python processes x 4 fake CPU devices on loopback (gloo), bounded
by a hard timeout: a hang fails the test instead of stalling the suite.
"""

import json
import os
import textwrap

import chex
import numpy as np
import pytest

from experiments.configs import ctr
from sfjax.checkpoint import checkpointer as checkpoint
from sfjax.data import dataset as dataset_lib
from sfjax.parallel import barriers
from sfjax.train import loop
from tests.parallel import two_processes  # launches two jax.distributed processes

pytestmark = pytest.mark.slow

_STEPS, _EVERY = 12, 6
_TIMEOUT_S = 30  # distributed.timeout_s of the launches
_MARGIN_S = 30  # start-up of the exit path on two busy shared cores
_TOL = dict(rtol=1e-4, atol=1e-5)


def _config(backend="cache"):
  c = ctr.get_config("smoke")
  c.data.synthetic.num_train, c.data.synthetic.num_eval = 2048, 512
  c.model.mlp_dims, c.model.embed_dim = (16,), 4
  c.embedding.optimizer, c.embedding.learning_rate, c.embedding.l2 = "adagrad", 0.1, 1e-4
  c.embedding.backend, c.embedding.cache_rows = backend, 1700.0
  c.train.steps, c.train.batch_size, c.train.eval_every, c.train.log_every = _STEPS, 32, 6, 100
  c.train.eval_batch_size, c.train.num_devices = 256, 1
  c.checkpoint.every_steps, c.checkpoint.keep = _EVERY, 4
  return c


# One process: joins with distributed.timeout_s, then trains through the library; the
# job's `kill` makes process `pid` SIGKILL itself before step `step` ("step") or while
# writing its table shard of checkpoint `step` ("checkpoint"), after noting the time.
_WORKER = textwrap.dedent("""
    import json, os, signal, time
    import numpy as np
    from tests.parallel import two_processes
    c, job, pid, out, _ = two_processes.join_run(
        lambda job: {**job["cfg"], "distributed.timeout_s": job["timeout_s"]})
    from sfjax.data import dataset as dataset_lib
    from sfjax.train import loop

    def die():
      with open(os.path.join(out, "killed_at"), "w") as f:
        f.write(repr(time.time()))
      os.kill(os.getpid(), signal.SIGKILL)

    data = dataset_lib.make_dataset(c.data, c.seed)
    kill = job.get("kill")
    # A relaunch lets the loop build the trainer (after resetting this process's mmap table);
    # a killed run is a fresh one, and every process builds it here alike (in step).
    trainer = loop.build_trainer(c, data.spec) if kill else None
    if kill and kill["pid"] == pid and kill["at"] == "step":
      real_step = trainer.run_step
      def run_step(state, *args, **kwargs):
        if int(state.step) + 1 == kill["step"]:
          die()
        return real_step(state, *args, **kwargs)
      trainer = trainer._replace(run_step=run_step)
    if kill and kill["pid"] == pid and kill["at"] == "checkpoint":
      from sfjax.checkpoint import checkpointer
      real_save = checkpointer.Checkpointer._save_everywhere
      def save(self, state, meta, step, final):
        if step == kill["step"]:
          from sfjax.checkpoint import table_format
          table_format.write_table = lambda *a, **k: die()
        return real_save(self, state, meta, step, final)
      checkpointer.Checkpointer._save_everywhere = save
    losses = []
    final, state = loop.train_and_evaluate(c, job["workdir"], dataset=data, trainer=trainer,
                                           loss_log=losses)
    np.save(os.path.join(out, f"losses_p{pid}.npy"), np.asarray(losses))
    with open(os.path.join(out, f"final_p{pid}.json"), "w") as f:
      json.dump(final, f)
""")


@pytest.fixture(scope="module")
def reference():
  """The uninterrupted 1-device run: (losses [steps], final metrics)."""
  c = _config(backend="device")
  losses = []
  final, _ = loop.train_and_evaluate(c, dataset=dataset_lib.make_dataset(c.data, c.seed),
                                     loss_log=losses)
  return np.asarray(losses), final


def _launch(out, workdir, kill=None, timeout=300):
  """One device per process: with several, gloo on CPU may itself abort the survivor at
  once when a peer's socket resets mid-collective ('collective mismatch' between its own
  device threads), before anything can name the peer (it still ends: no hang)."""
  out.mkdir()
  c = _config()  # host tables on mmap files: each process its own <host_path>/process-<i>
  c.embedding.host_storage, c.embedding.host_path = "mmap", str(workdir) + "_tables"
  job = {"cfg": two_processes.flat_config(c), "workdir": str(workdir),
         "timeout_s": _TIMEOUT_S, "kill": kill}
  return two_processes.run_processes(_WORKER, json.dumps(job), out, timeout, devices=1)


def _check_survivor(ended, out, phase):
  """Process 0 outlived the killed process 1 by at most the timeout + margin, exited with
  `barriers.PEER_FAILURE_EXIT`, and its error names process 1 and `phase`."""
  killed, survivor = ended[1], ended[0]
  assert killed.returncode == -9, killed.log[-3000:]
  killed_at = float((out / "killed_at").read_text())
  assert survivor.returncode == barriers.PEER_FAILURE_EXIT, survivor.log[-4000:]
  assert survivor.ended_at - killed_at < _TIMEOUT_S + _MARGIN_S, survivor.log[-4000:]
  errors = [line for line in survivor.log.splitlines() if "process 1" in line and phase in line]
  assert errors, survivor.log[-4000:]


def _check_resumed(out, reference):
  """Both relaunched processes resumed at step _EVERY + 1 and ended as the reference."""
  ref_losses, ref_final = reference
  for pid in (0, 1):
    losses = np.load(out / f"losses_p{pid}.npy")
    final = json.loads((out / f"final_p{pid}.json").read_text())
    chex.assert_trees_all_close(losses, ref_losses[_EVERY:], **_TOL)
    for key in ("auc", "logloss", "eval_auc", "eval_logloss"):
      np.testing.assert_allclose(final[key], ref_final[key], rtol=1e-4, err_msg=key)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("at,phase", [
    ("step", f"training after checkpoint {checkpoint.step_dir_name(_EVERY)}"),
    ("checkpoint", f"checkpoint {checkpoint.step_dir_name(_STEPS)}")])
def test_a_killed_process_ends_the_other_and_a_relaunch_resumes(tmp_path, reference, at, phase):
  workdir = tmp_path / "work"
  step = _EVERY + 3 if at == "step" else _STEPS
  ended = _launch(tmp_path / "killed", workdir, kill={"pid": 1, "at": at, "step": step})
  _check_survivor(ended, tmp_path / "killed", phase)
  root = os.path.join(workdir, checkpoint.CHECKPOINT_DIR)
  assert checkpoint.committed_steps(root) == [_EVERY]  # the interrupted save never counted
  relaunched = _launch(tmp_path / "relaunched", workdir)
  for pid, e in enumerate(relaunched):
    assert e.returncode == 0, f"process {pid}:\n{e.log[-4000:]}"
  _check_resumed(tmp_path / "relaunched", reference)
  assert checkpoint.committed_steps(root) == [_EVERY, _STEPS]
  assert not [n for n in os.listdir(root) if n.startswith("tmp.")]  # the leftover is gone
  assert sorted(os.listdir(str(workdir) + "_tables")) == ["process-0", "process-1"]


@pytest.mark.timeout(600)
def test_a_killed_coordinator_ends_the_other_process_at_once(tmp_path):
  out = tmp_path / "killed"
  ended = _launch(out, tmp_path / "work", kill={"pid": 0, "at": "step", "step": _EVERY + 3})
  killed, survivor = ended
  assert killed.returncode == -9, killed.log[-3000:]
  killed_at = float((out / "killed_at").read_text())
  assert survivor.returncode != 0 and survivor.ended_at - killed_at < _TIMEOUT_S + _MARGIN_S
  # jax's client ends it as soon as the coordination service is gone (or our watchdog does)
  assert ("leader task was preempted/died" in survivor.log
          or "process 0 (the coordinator) is unreachable" in survivor.log), survivor.log[-4000:]


# Process 1 skips the second barrier and waits; process 0 must be told it did not come.
_BARRIER_WORKER = textwrap.dedent("""
    import sys, time
    from sfjax.parallel import barriers, distributed
    from tests.parallel import two_processes
    _, job, pid, out, _ = two_processes.join_run(
        lambda job: {"distributed.timeout_s": job["timeout_s"]})
    port = sys.argv[2]
    if pid == 0:  # the coordinator's listening sockets on its port (/proc/net/tcp{,6})
      for name in ("tcp", "tcp6"):
        for row in open("/proc/net/" + name).read().splitlines()[1:]:
          local, state = row.split()[1], row.split()[3]
          if state == "0A" and int(local.rsplit(":", 1)[1], 16) == int(port):
            print("listening", name, local.rsplit(":", 1)[0], flush=True)
    print("own path", distributed.process_path("/t"), flush=True)
    print("values", barriers.exchange("first", f"from {pid}"), flush=True)
    print("failed", distributed.failed_processes(pid == 0, "flags"), flush=True)
    if pid == 1:
      time.sleep(job["timeout_s"] + 2)
      barriers.barrier("late")  # process 0 has given up on it by now
    else:
      t0 = time.time()
      try:
        barriers.barrier("second")
      except barriers.PeerFailureError as err:
        print(f"raised after {time.time() - t0:.1f} s: {err}", flush=True)
""")


@pytest.mark.timeout(180)
def test_a_timed_barrier_names_the_process_that_did_not_come(tmp_path):
  ended = two_processes.run_processes(_BARRIER_WORKER, json.dumps({"timeout_s": 4}), tmp_path,
                                      timeout=150)
  log0 = ended[0].log
  assert "values ['from 0', 'from 1']" in log0 and "failed [1]" in log0, log0[-3000:]
  # the coordinator listens on loopback only (127.0.0.1 = 0100007F, or IPv4-mapped
  # ::ffff:127.0.0.1), not on every interface (0.0.0.0 / [::], all zeros)
  listening = [x.split()[2] for x in log0.splitlines() if x.startswith("listening")]
  assert listening and all(a in ("0100007F", "0000000000000000FFFF00000100007F")
                           for a in listening), log0[-3000:]
  assert "own path /t/process-0" in log0 and "own path /t/process-1" in ended[1].log
  line = next(x for x in log0.splitlines() if x.startswith("raised after"))
  assert "process 1 did not reach barrier 'second' within 4 s (this is process 0)" in line
  assert 3.5 < float(line.split()[2]) < 4 + 10, line
  assert ended[0].returncode == barriers.PEER_FAILURE_EXIT  # ends at once, no shutdown wait
