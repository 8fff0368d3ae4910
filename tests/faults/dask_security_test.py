"""Issue #25 item 5: the Dask cluster a study starts (sfjax/ctr_search/executor_dask.py) speaks
TLS with the study's own certificate, listens on loopback only, serves no HTTP (no dashboard on
8787), refuses a client without the certificate and accepts one with it; `study.dask_address`
parsing (`parse_address`) gives one-line errors naming the setting."""

import os

import distributed
import psutil
import pytest

from sfjax.ctr_search.executor_dask import DaskExecutor, parse_address

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def executor():
  # The runners are built only when a job runs: these tests submit plain functions.
  with DaskExecutor(None, 1, False, num_workers=2) as ex:
    yield ex


def _listening(pids):
  return {(c.laddr.ip, c.laddr.port) for pid in pids
          for c in psutil.Process(pid).net_connections(kind="inet") if c.status == "LISTEN"}


def _port(address):
  return int(address.rsplit(":", 1)[1])


def test_cluster_listens_on_loopback_tls_ports_only_and_serves_no_http(executor):
  info = executor.client.scheduler_info()
  assert executor.address.startswith("tls://127.0.0.1:")
  workers = info["workers"]
  assert len(workers) == 2 and all(w.startswith("tls://127.0.0.1:") for w in workers)
  nannies = [w["nanny"] for w in workers.values()]
  worker_pids = executor.client.run(os.getpid)
  listening = _listening([os.getpid(), *worker_pids.values()])
  expected = {("127.0.0.1", _port(a)) for a in [executor.address, *workers, *nannies]}
  # Before the fix the scheduler also served HTTP on 127.0.0.1:8787 (dashboard_address=None
  # only drops the Bokeh pages) and each worker on a random port.
  assert listening == expected
  assert all(port != 8787 for _, port in listening)


def test_client_without_the_certificate_is_refused(executor):
  port = _port(executor.address)
  with pytest.raises(OSError):  # plain TCP to a TLS listener: the handshake never completes
    distributed.Client(f"tcp://127.0.0.1:{port}", timeout="5s")
  with pytest.raises(OSError):  # TLS with a certificate the study did not issue
    distributed.Client(executor.address, security=distributed.Security.temporary(),
                       timeout="5s")


def test_client_with_the_studys_certificate_runs_tasks(executor, tmp_path):
  address = executor.shared_address(str(tmp_path / "tls"))
  for name in ("ca.pem", "cert.pem", "key.pem"):
    assert os.stat(tmp_path / "tls" / name).st_mode & 0o777 == 0o600
  with DaskExecutor(None, 1, False, address=address) as joined:
    assert joined.cluster is None
    assert joined.client.submit(pow, 3, 4, pure=False).result(timeout=60) == 81


def test_parse_address(tmp_path):
  assert parse_address("tcp://10.0.0.1:8786") == ("tcp://10.0.0.1:8786", None)
  assert parse_address("10.0.0.1:8786") == ("tcp://10.0.0.1:8786", None)  # Dask's default
  for name in ("ca", "cert", "key"):
    (tmp_path / f"{name}.pem").write_text("x")
  files = {n: str(tmp_path / f"{n}.pem") for n in ("ca", "cert", "key")}
  base, security = parse_address(
      f"tls://h:1?ca={files['ca']}&cert={files['cert']}&key={files['key']}")
  assert base == "tls://h:1" and security.require_encryption
  assert (security.tls_ca_file, security.tls_client_cert, security.tls_client_key) == (
      files["ca"], files["cert"], files["key"])
  errors = {
      "udp://h:1": "expected tcp://HOST:PORT",
      "": "expected tcp://HOST:PORT",
      f"tcp://h:1?ca={files['ca']}": "TLS files given for a tcp:// address",
      f"tls://h:1?ca={files['ca']}&cert={files['cert']}": "missing ['key']",
      f"tls://h:1?ca={files['ca']}&cert={files['cert']}&key=/no/such.pem": "key=/no/such.pem",
      f"tls://h:1?ca={files['ca']}&pem=x": "unknown setting(s) ['pem']",
      "tls://h:1": "needs ?ca=CA.pem&cert=CERT.pem&key=KEY.pem",
  }
  for spec, message in errors.items():
    with pytest.raises(ValueError, match="^study.dask_address: ") as err:
      parse_address(spec)
    assert message in str(err.value) and "\n" not in str(err.value), spec


def test_shared_address_is_refused_for_a_joined_cluster(executor, tmp_path):
  address = executor.shared_address(str(tmp_path / "tls"))
  with DaskExecutor(None, 1, False, address=address) as joined:
    with pytest.raises(ValueError, match="only for a cluster this executor started"):
      joined.shared_address(str(tmp_path / "again"))
