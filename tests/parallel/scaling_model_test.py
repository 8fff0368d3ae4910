"""The scaling cost model against hand-computed cases."""

import pytest

from sfjax.parallel import scaling_model as sm


def _cluster(num_devices=8, per_node=4, **kw):
  base = dict(num_devices=num_devices, devices_per_node=per_node, intra=sm.Link(100.0, 0.5),
              inter=sm.Link(10.0, 2.0), device_flops=1000.0, device_bytes_per_s=500.0,
              input_examples_per_s=40.0, coordinator_bytes_per_s=80.0, step_overhead_s=0.25)
  base.update(kw)
  return sm.Cluster(**base)


def _profile(**kw):
  base = dict(per_device_batch=2, flops=3000.0, bytes_accessed=1000.0,
              fixed_collectives={"all-reduce": 400.0},
              per_example_collectives={"all-gather": 10.0, "reduce-scatter": 5.0},
              example_bytes=4.0)
  base.update(kw)
  return sm.StepProfile(**base)


def test_one_node_ring():
  # g = 4, n = 1: all-reduce 2 [3/4 * 400 / 100 + 3 * 0.5] = 2 * (3 + 1.5) = 9
  c = _cluster(num_devices=4)
  assert sm.collective_seconds("all-reduce", 400.0, c) == pytest.approx(9.0)
  # all-gather: 3/4 * 400 / 100 + 1.5 = 4.5
  assert sm.collective_seconds("all-gather", 400.0, c) == pytest.approx(4.5)
  # three all-reduces of 400 bytes in all: the latencies three times: 2 (3 + 3 * 1.5) = 15
  assert sm.collective_seconds("all-reduce", 400.0, c, count=3) == pytest.approx(15.0)
  assert sm.collectives_seconds({"all-reduce": 400.0, "all-gather": 400.0}, c,
                                {"all-reduce": 3}) == pytest.approx(19.5)


def test_two_nodes_hierarchical():
  # g = 4, n = 2: intra 3/4 * 400/100 + 1.5 = 4.5; inter 1/2 * 400/4 / 10 + 1 * 2 = 7
  c = _cluster(num_devices=8)
  assert c.num_nodes == 2
  assert sm.collective_seconds("reduce-scatter", 400.0, c) == pytest.approx(11.5)
  assert sm.collective_seconds("all-reduce", 400.0, c) == pytest.approx(23.0)


def test_one_device_per_node_and_one_device():
  c = _cluster(num_devices=2, per_node=1)  # inter only: 1/2 * 400 / 10 + 2 = 22
  assert sm.collective_seconds("all-gather", 400.0, c) == pytest.approx(22.0)
  assert sm.collective_seconds("all-reduce", 400.0, _cluster(num_devices=1)) == 0.0
  with pytest.raises(ValueError, match="collective kind"):
    sm.collective_seconds("all-to-all", 1.0, c)


def test_step_sizes_grow_with_the_global_batch():
  assert sm.step_sizes(_profile(), 8) == {"all-reduce": 400.0, "all-gather": 160.0,
                                          "reduce-scatter": 80.0}


def test_predict_device_bound():
  c, p = _cluster(num_devices=8), _profile()
  # compute = max(3000/1000, 1000/500) = 3; collectives on 8 = 2 nodes x 4:
  # all-reduce 400: 23; all-gather 160: (3/4*1.6 + 1.5) + (1/2*40/10 + 2) = 2.7 + 4 = 6.7;
  # reduce-scatter 80: (0.6 + 1.5) + (1 + 2) = 5.1
  # input: 16 / 2 / 40 = 0.2 + 2 * 16 * 4 / 80 = 1.6 -> 1.8
  t = sm.predict_step(p, c)
  assert t.compute == pytest.approx(3.0) and t.collectives == pytest.approx(34.8)
  assert t.input == pytest.approx(1.8)
  assert t.step == pytest.approx(3.0 + 34.8 + 0.25)
  assert t.examples_per_s == pytest.approx(16 / 38.05)
  shared = sm.predict_step(p, c._replace(input_overlaps=False))  # input and devices take turns
  assert shared.step == pytest.approx(1.8 + 38.05)


def test_predict_input_bound_and_memory_bound():
  c = _cluster(num_devices=1, per_node=1, input_examples_per_s=0.5)
  t = sm.predict_step(_profile(flops=10.0, bytes_accessed=1000.0), c)
  assert t.compute == pytest.approx(2.0) and t.collectives == 0.0
  assert t.input == pytest.approx(4.0) and t.step == pytest.approx(4.0)  # 2 examples / 0.5


def test_calibrate_reproduces_the_measured_step():
  c, p = _cluster(num_devices=4), _profile()
  coll = sm.collectives_seconds(sm.step_sizes(p, 4), c)
  fitted = sm.calibrate_compute(p, c, coll + 0.25 + 1.5)
  assert fitted.device_flops == pytest.approx(2000.0)  # 3000 flops in 1.5 s
  assert sm.predict_step(p, fitted).compute == pytest.approx(1.5)
  with pytest.raises(ValueError, match="cannot calibrate"):
    sm.calibrate_compute(p, c, coll)


def test_fit_link_recovers_bandwidth_and_latency():
  link = sm.Link(50.0, 0.1)
  c = sm.Cluster(4, 4, link, link, 1.0, 1.0, 1.0, 1.0)
  sizes = [100.0, 1000.0, 4000.0]
  times = [sm.collective_seconds("all-reduce", s, c) for s in sizes]
  fitted = sm.fit_link(sizes, times, "all-reduce", 4)
  assert fitted.bytes_per_s == pytest.approx(50.0) and fitted.latency_s == pytest.approx(0.1)
  with pytest.raises(ValueError, match="do not grow"):
    sm.fit_link([1.0, 2.0], [2.0, 1.0], "all-reduce", 4)
  with pytest.raises(ValueError, match="need >= 2"):
    sm.fit_link([1.0], [1.0], "all-reduce", 4)


def test_h100_defaults():
  c = sm.h100_cluster(64, 1e6, 1e9)
  assert (c.num_nodes, c.devices_per_node, c.intra.bytes_per_s, c.inter.bytes_per_s) == (
      8, 8, 450e9, 50e9)
