"""Many processes on jax.distributed: settings, the process's rows, agreement, and a
2-process x 4-device training run equal to the 1-device reference.

The 2-process run launches two Python subprocesses on loopback (gloo CPU collectives),
each with 4 fake CPU devices, bounded by a timeout.
"""

import json
import textwrap

import chex
import jax
import numpy as np
import pytest

from experiments.configs import ctr
from sfjax.core.errors import ConfigError
from sfjax.data import dataset as dataset_lib
from sfjax.parallel import distributed
from sfjax.train import loop
from tests.parallel import two_processes  # launches two jax.distributed processes

_STEPS = 12


def _config(optimizer="adagrad"):
  c = ctr.get_config("smoke")
  c.data.synthetic.num_train, c.data.synthetic.num_eval = 2048, 512
  c.model.mlp_dims, c.model.embed_dim = (16,), 4
  c.embedding.optimizer, c.embedding.learning_rate, c.embedding.l2 = optimizer, 0.1, 1e-4
  c.train.steps, c.train.batch_size, c.train.eval_every, c.train.log_every = _STEPS, 32, 6, 100
  c.train.eval_batch_size, c.train.num_devices = 256, 1
  return c


# ---- settings -----------------------------------------------------------------------


def test_no_distributed_block_or_empty_fields_is_one_process(monkeypatch):
  monkeypatch.delenv(distributed.ENV_COORDINATOR, raising=False)
  c = _config()
  assert not distributed.distributed_settings(c).enabled
  del c["distributed"]
  assert not distributed.distributed_settings(c).enabled
  assert distributed.initialize_distributed(c) == 1


def test_explicit_fields():
  c = _config()
  c.distributed.coordinator, c.distributed.num_processes, c.distributed.process_id = (
      "10.0.0.1:1234", 2, 1)
  s = distributed.distributed_settings(c)
  assert s == distributed.Settings("10.0.0.1:1234", 2, 1, False) and s.enabled


def test_environment_variables(monkeypatch):
  monkeypatch.setenv(distributed.ENV_COORDINATOR, "host0:999")
  monkeypatch.setenv(distributed.ENV_NUM_PROCESSES, "4")
  monkeypatch.setenv(distributed.ENV_PROCESS_ID, "3")
  assert distributed.distributed_settings(_config()) == distributed.Settings("host0:999", 4, 3, False)
  monkeypatch.setenv(distributed.ENV_PROCESS_ID, "x")
  with pytest.raises(ConfigError, match="JAX_PROCESS_ID"):
    distributed.distributed_settings(_config())
  monkeypatch.delenv(distributed.ENV_PROCESS_ID)
  with pytest.raises(ConfigError, match="JAX_PROCESS_ID"):
    distributed.distributed_settings(_config())


@pytest.mark.parametrize("field,value,match", [
    ("coordinator", "nohostport", r"distributed\.coordinator: expected HOST:PORT"),
    ("coordinator", 5, r"distributed\.coordinator"),
    ("num_processes", 0, r"distributed\.num_processes: required"),
    ("process_id", 2, r"distributed\.process_id: must be in \[0, 2\)"),
    ("num_processes", 1.5, r"distributed\.num_processes: must be an integer"),
    ("auto_detect", "yes", r"distributed\.auto_detect"),
    ("timeout_s", 0, r"distributed\.timeout_s: must be a number > 0"),
    ("timeout_s", "30", r"distributed\.timeout_s"),
    ("bind_address", "everywhere", r"distributed\.bind_address: expected HOST:PORT"),
])
def test_bad_fields_name_the_field(field, value, match, monkeypatch):
  monkeypatch.delenv(distributed.ENV_COORDINATOR, raising=False)
  c = {"distributed": {"coordinator": "127.0.0.1:1", "num_processes": 2, "process_id": 0}}
  c["distributed"][field] = value  # a plain dict: any type reaches the check
  with pytest.raises(ConfigError, match=match):
    distributed.distributed_settings(c)


def test_the_coordinator_binds_the_address_it_was_given_unless_told_otherwise(monkeypatch):
  monkeypatch.delenv(distributed.ENV_COORDINATOR, raising=False)
  monkeypatch.delenv(distributed.ENV_BIND_ADDRESS, raising=False)
  c = _config()
  c.distributed.coordinator, c.distributed.num_processes, c.distributed.process_id = (
      "127.0.0.1:1234", 2, 0)
  s = distributed.distributed_settings(c)
  assert s.timeout_s == 300.0 and distributed.bind_address(s) == "127.0.0.1:1234"  # not [::]
  monkeypatch.setenv(distributed.ENV_BIND_ADDRESS, "10.0.0.5:1234")
  assert distributed.bind_address(s) == "10.0.0.5:1234"
  c.distributed.bind_address, c.distributed.timeout_s = "[::]:1234", 30.0  # asked for
  s = distributed.distributed_settings(c)
  assert distributed.bind_address(s) == "[::]:1234" and s.timeout_s == 30.0


def test_processes_without_a_coordinator_name_the_field(monkeypatch):
  monkeypatch.delenv(distributed.ENV_COORDINATOR, raising=False)
  c = _config()
  c.distributed.num_processes = 2
  with pytest.raises(ConfigError, match=r"distributed\.coordinator: required"):
    distributed.distributed_settings(c)


# ---- one-process behaviour of the helpers -----------------------------------------


def test_one_process_helpers_are_identities():
  x = np.arange(12.0).reshape(6, 2)
  assert distributed.process_rows(6) == slice(0, 6)
  np.testing.assert_array_equal(distributed.allgather_rows(x), x)
  np.testing.assert_array_equal(distributed.broadcast(x), x)
  distributed.check_agreement("x", x)
  assert distributed.failed_processes(True) == [] and distributed.failed_processes(False) == [0]
  assert distributed.is_main_process()
  assert distributed.process_path("/data/table") == "/data/table"  # several: .../process-<i>
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("data",))
  sharded = distributed.put_global(x, jax.sharding.NamedSharding(mesh, jax.P("data")))
  np.testing.assert_array_equal(distributed.local_rows(sharded), x)


def test_fingerprint_sees_values_shapes_and_dtypes():
  a = np.arange(4, dtype=np.int32)
  assert np.array_equal(distributed._fingerprint(a), distributed._fingerprint(a.copy()))
  assert not np.array_equal(distributed._fingerprint(a), distributed._fingerprint(a + 1))
  assert not np.array_equal(distributed._fingerprint(a), distributed._fingerprint(a.reshape(2, 2)))
  assert not np.array_equal(distributed._fingerprint(a), distributed._fingerprint(a.astype(np.int64)))


# ---- two processes x 4 devices --------------------------------------------------------

# One process of the run: joins, trains through the library like experiments/train_ctr.py,
# and saves its losses, final metrics and the (replicated) table.
_WORKER = textwrap.dedent("""
    import json, os
    import numpy as np
    from tests.parallel import two_processes
    c, _, pid, out, _ = two_processes.join_run()
    import jax
    from sfjax.data import dataset as dataset_lib
    from sfjax.train import loop
    assert jax.process_index() == pid and jax.device_count() == 8
    assert jax.local_device_count() == 4
    losses = []
    data = dataset_lib.make_dataset(c.data, c.seed)
    trainer = loop.build_trainer(c, data.spec)
    final, state = loop.train_and_evaluate(c, os.path.join(out, "work"), dataset=data,
                                           trainer=trainer, loss_log=losses)
    # device backend: the whole table, replicated
    ids = np.arange(state.table.values.shape[0])
    values, slots = np.asarray(state.table.values), np.asarray(state.table.opt_slots)
    np.savez(os.path.join(out, f"p{pid}.npz"), losses=np.asarray(losses), ids=ids,
             values=values, slots=slots)
    with open(os.path.join(out, f"p{pid}.json"), "w") as f:
      json.dump(final, f)
""")


def _run_two_processes(config, out_dir, timeout=110):
  two_processes.launch(_WORKER, json.dumps(two_processes.flat_config(config)), out_dir, timeout)


def test_two_processes_match_the_one_device_reference(tmp_path):
  """The device backend; the cache backend over two processes (every row optimizer,
  with and without checkpoints) is tested in multiprocess_checkpoint_test.py."""
  config = _config()
  data = dataset_lib.make_dataset(config.data, config.seed)
  ref_losses = []
  ref_final, ref_state = loop.train_and_evaluate(config, dataset=data, loss_log=ref_losses)
  _run_two_processes(config, tmp_path)
  tol = dict(rtol=1e-4, atol=1e-5)
  runs = [np.load(tmp_path / f"p{pid}.npz") for pid in (0, 1)]
  finals = [json.loads((tmp_path / f"p{pid}.json").read_text()) for pid in (0, 1)]
  for run, final in zip(runs, finals, strict=True):
    chex.assert_trees_all_close(run["losses"], np.asarray(ref_losses), **tol)
    ids = run["ids"]
    chex.assert_trees_all_close(run["values"], np.asarray(ref_state.table.values)[ids],
                                rtol=1e-3, atol=1e-4)
    chex.assert_trees_all_close(run["slots"], np.asarray(ref_state.table.opt_slots)[ids],
                                rtol=1e-3, atol=1e-4)
    assert final["num_processes"] == 2 and final["num_devices"] == 8
    for key in ("auc", "logloss", "eval_auc", "eval_logloss"):
      np.testing.assert_allclose(final[key], ref_final[key], rtol=1e-4, err_msg=key)
  # Both processes hold the same state and the same metrics; only process 0 writes files.
  np.testing.assert_array_equal(runs[0]["values"], runs[1]["values"])
  assert finals[0]["auc"] == finals[1]["auc"]
  records = [json.loads(line)
             for line in (tmp_path / "work" / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records] == [6, 12]
  np.testing.assert_allclose(records[-1]["auc"], ref_final["auc"], rtol=1e-4)
