"""Collective bytes read from HLO text: hand-written lines and a compiled 8-device program."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from sfjax.parallel import collectives
from sfjax.parallel import mesh as mesh_lib

_HLO = """
  %all-reduce.8 = (f32[13]{0}, f32[512,5]{1,0}, f32[]) all-reduce(%a, %b, %c), channel_id=1, replica_groups=mesh['axis_0'=8] {'axis_0'}, to_apply=%add
  %ag = f32[64,4]{1,0} all-gather(%x), channel_id=2, replica_groups=[1,4]<=[4], dimensions={0}
  %rs = bf16[8,4]{1,0} reduce-scatter(%y), channel_id=3, replica_groups={{0,1},{2,3}}, dimensions={0}
  %a2a = s32[16]{0} all-to-all(%z), channel_id=4, replica_groups={{0,1,2,3,4,5,6,7}}
  %ags = (f32[8,4]{1,0}, f32[64,4]{1,0}) all-gather-start(%w), channel_id=5, replica_groups=[1,8]<=[8]
  %agd = f32[64,4]{1,0} all-gather-done(%ags)
  %fusion = f32[] fusion(%all-reduce.8), kind=kLoop
  %one = f32[10]{0} all-reduce(%v), channel_id=6, replica_groups={{0},{1}}
"""


def test_hand_written_collectives_are_sized_per_device():
  found = collectives._parse_collectives(_HLO, num_devices=8)
  assert [c.kind for c in found] == ["all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                                     "all-gather"]  # done / fusion / 1-device groups skipped
  ar, ag, rs, a2a, ags = found
  assert (ar.operand_bytes, ar.group_size) == ((13 + 512 * 5 + 1) * 4, 8)
  assert ar.ring_bytes == pytest.approx(2 * 7 / 8 * ar.operand_bytes)
  assert (ag.result_bytes, ag.operand_bytes, ag.group_size) == (1024, 256, 4)
  assert ag.ring_bytes == pytest.approx(3 / 4 * 1024)
  assert (rs.result_bytes, rs.operand_bytes, rs.group_size) == (64, 128, 2)
  assert rs.ring_bytes == pytest.approx(64)
  assert (a2a.operand_bytes, a2a.ring_bytes) == (64, pytest.approx(7 / 8 * 64))
  assert (ags.result_bytes, ags.operand_bytes) == (1024, 128)  # operands of the async tuple skipped
  totals = collectives.collective_bytes(_HLO, 8)
  assert totals["count"] == 5
  assert totals["all-reduce_bytes"] == ar.operand_bytes
  assert totals["all-gather_bytes"] == 256 + 128
  assert totals["operand_bytes"] == sum(c.operand_bytes for c in found)


def test_compiled_psum_and_all_gather_over_eight_devices():
  mesh = mesh_lib.make_mesh(8)
  x = jax.device_put(np.ones((8 * 16, 4), np.float32), NamedSharding(mesh, P("data")))

  def exchange(block):
    return jax.lax.psum(block, "data"), jax.lax.all_gather(block, "data", tiled=True)

  f = jax.shard_map(exchange, mesh=mesh, in_specs=P("data"), out_specs=(P(), P()),
                    check_vma=False)
  text = jax.jit(f).lower(x).compile().as_text()
  totals = collectives.collective_bytes(text, 8)
  block = 16 * 4 * 4  # one device's [16, 4] float32 block
  assert totals["all-reduce_bytes"] == block and totals["all-gather_bytes"] == block
  assert totals["ring_bytes"] == pytest.approx(2 * 7 / 8 * block + 7 / 8 * 8 * block)


def test_a_program_without_collectives_moves_nothing():
  text = jax.jit(lambda a: a * 2).lower(jnp.ones(4)).compile().as_text()
  assert collectives.collective_bytes(text, 1) == {
      "count": 0, "operand_bytes": 0, "ring_bytes": 0.0, **{f"{k}_bytes": 0 for k in collectives.KINDS}}
