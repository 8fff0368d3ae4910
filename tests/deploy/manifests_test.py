"""deploy/: the SLURM batch script and the Kubernetes indexed Job run the same training
command, with the settings `distributed.distributed_settings` reads (issue #24, Deliver 6).

The Kubernetes manifest is parsed (PyYAML, which comes with optuna); the environment a
pod gets is fed to the real settings function, and the SLURM environment to JAX's own
cluster detection as `initialize_distributed` runs it.
"""

import os
import re
import shlex

import pytest
import yaml

from experiments.configs import ctr
from sfjax.parallel import distributed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_MODULE = "experiments.train_ctr"
_CONFIG_FILE = "experiments/configs/ctr.py"
_INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


def _read(path):
  with open(os.path.join(ROOT, path)) as f:
    return f.read()


@pytest.fixture(scope="module")
def k8s():
  """{kind: document} of deploy/k8s/train-job.yaml."""
  docs = list(yaml.safe_load_all(_read("deploy/k8s/train-job.yaml")))
  return {d["kind"]: d for d in docs}


def _container(job):
  (container,) = job["spec"]["template"]["spec"]["containers"]
  return container


def _overrides_exist(args):
  """Every `--config.a.b=V` names a field of the CTR config (a typo would fail the run)."""
  flat = {}

  def walk(prefix, d):
    for k, v in d.items():
      walk(prefix + k + ".", v) if isinstance(v, dict) else flat.setdefault(prefix + k, v)

  walk("", ctr.get_config().to_dict())
  for arg in args:
    if arg.startswith("--config."):
      field = arg[len("--config."):].split("=", 1)[0]
      assert field in flat, f"{arg}: no config field {field}"


def test_the_job_is_indexed_with_one_process_per_completion(k8s):
  job = k8s["Job"]
  spec = job["spec"]
  assert spec["completionMode"] == "Indexed"
  env = {e["name"]: e for e in _container(job)["env"]}
  processes = int(env[distributed.ENV_NUM_PROCESSES]["value"])
  assert spec["completions"] == spec["parallelism"] == processes
  assert env[distributed.ENV_PROCESS_ID]["valueFrom"]["fieldRef"]["fieldPath"] == _INDEX_FIELD
  assert spec["backoffLimit"] == 0 and spec["template"]["spec"]["restartPolicy"] == "Never"


def test_the_coordinator_is_pod_0_through_the_headless_service(k8s):
  job, service = k8s["Job"], k8s["Service"]
  pod = job["spec"]["template"]
  assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"]
  assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
  assert pod["spec"]["subdomain"] == service["metadata"]["name"]
  env = {e["name"]: e.get("value") for e in _container(job)["env"]}
  host, port = env[distributed.ENV_COORDINATOR].rsplit(":", 1)
  assert host == f"{job['metadata']['name']}-0.{service['metadata']['name']}"
  assert int(port) in [p["port"] for p in service["spec"]["ports"]]
  assert int(port) in [p["containerPort"] for p in _container(job)["ports"]]


def test_a_pods_environment_gives_the_settings_of_its_index(k8s, monkeypatch):
  container = _container(k8s["Job"])
  for index in (0, 1):
    for e in container["env"]:
      value = str(index) if "valueFrom" in e else e["value"]
      monkeypatch.setenv(e["name"], value)
    s = distributed.distributed_settings(ctr.get_config())
    assert (s.coordinator, s.num_processes, s.process_id) == (
        "sfjax-train-0.sfjax-train:1234", k8s["Job"]["spec"]["completions"], index)
    assert distributed.bind_address(s) == s.coordinator  # pod 0 binds its own name only


def test_kubernetes_and_slurm_run_the_same_command_on_real_config_fields(k8s):
  container = _container(k8s["Job"])
  assert container["command"] == ["python", "-m", _MODULE]
  assert f"--config={_CONFIG_FILE}" in container["args"]
  _overrides_exist(container["args"])
  script = _read("deploy/slurm/train.sbatch")
  lines = script.splitlines()
  start = next(i for i, line in enumerate(lines) if line.startswith("srun "))
  end = next(i for i in range(start, len(lines)) if not lines[i].endswith("\\"))
  command = " ".join(line.rstrip("\\").strip() for line in lines[start:end + 1])
  words = shlex.split(command.replace('"${PYTHON}"', "python").replace('"$@"', ""))
  assert words[words.index("-m") + 1] == _MODULE
  assert f"--config={_CONFIG_FILE}" in words
  assert "--config.distributed.auto_detect=True" in words
  _overrides_exist(words)
  assert re.search(r"^#SBATCH --ntasks-per-node=\d+$", script, re.M)


def test_slurms_environment_is_detected_and_the_coordinator_binds_the_first_node(monkeypatch):
  for name, value in {"SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "gpu[007-008]",
                      "SLURM_NTASKS": "16", "SLURM_PROCID": "9", "SLURM_LOCALID": "1"}.items():
    monkeypatch.setenv(name, value)
  monkeypatch.delenv(distributed.ENV_COORDINATOR, raising=False)
  monkeypatch.delenv(distributed.ENV_BIND_ADDRESS, raising=False)
  monkeypatch.delenv("JAX_COORDINATOR_PORT", raising=False)
  c = ctr.get_config()
  c.distributed.auto_detect = True
  s, local_devices = distributed._detected(distributed.distributed_settings(c))  # pylint: disable=protected-access
  port = 4242 % 2**12 + 65535 - 2**12 + 1  # JAX's port of a SLURM job
  assert (s.coordinator, s.num_processes, s.process_id) == (f"gpu007:{port}", 16, 9)
  assert list(local_devices) == [1]  # task SLURM_LOCALID drives its node's GPU 1
  assert distributed.bind_address(s) == f"gpu007:{port}"
