"""Counter-based initialisers: a pure function of (seed, table, row), with the asked-for spread."""

import hashlib

import chex
import numpy as np

from sfjax.embedding import host_table, initializers


def test_init_rows_are_independent_of_order_and_batching():
  rows = np.array([0, 5, 17, 2**40 + 3], np.int64)
  full = initializers.init_rows(3, 0, rows, 4, 0.1)
  chex.assert_shape(full, (4, 4))
  assert full.dtype == np.float32
  perm = np.array([3, 1, 0, 2])
  chex.assert_trees_all_equal(initializers.init_rows(3, 0, rows[perm], 4, 0.1), full[perm])
  one_by_one = np.concatenate([initializers.init_rows(3, 0, rows[i:i + 1], 4, 0.1) for i in range(4)])
  chex.assert_trees_all_equal(one_by_one, full)
  chex.assert_trees_all_equal(initializers.init_rows(3, 0, rows, 4, 0.1), full)  # deterministic


def test_init_rows_values_are_pinned():
  """Rows never written are initialised again at every read, so the values must never change
  between versions (a resumed table would change under the trainer): pinned bit for bit."""
  got = initializers.init_rows(7, 2, np.array([0, 1, 99_999, 2**40 + 3]), 3, 0.1)
  assert got.view(np.uint32).tolist() == [
      [3171720584, 1027763179, 3184758258], [1038950578, 1030541499, 1023057325],
      [1039824621, 1040875972, 1020808118], [3190686595, 1035844183, 3176289293]]
  many = initializers.init_rows(7, 0, np.arange(5000), 5, np.linspace(0.01, 0.2, 5000))
  assert hashlib.sha256(many.tobytes()).hexdigest() == (
      "e2bdbc61e2d1f272c2b2f725844d06573b933e14fd4ab909ae09f126d6e930f0")


def test_init_rows_in_blocks_equal_row_by_row_with_per_row_stddevs():
  rows = np.random.default_rng(0).choice(10**9, size=2 * initializers._BLOCK_ROWS + 7,
                                         replace=False)
  stddevs = np.linspace(0.01, 0.3, rows.size)
  full = initializers.init_rows(1, 0, rows, 3, stddevs)
  for i in (0, initializers._BLOCK_ROWS - 1, initializers._BLOCK_ROWS, rows.size - 1):
    chex.assert_trees_all_equal(full[i], initializers.init_rows(1, 0, rows[i:i + 1], 3,
                                                                stddevs[i:i + 1])[0])
  unit = full / stddevs[:, None]  # each row scaled by its own stddev: unit spread throughout
  assert np.abs(unit).max() <= np.sqrt(3.0) * (1 + 1e-6)
  for block in np.array_split(unit, 4):  # ~3k samples each: std error ~1.3 %
    assert abs(block.std() - 1.0) < 0.06
  chex.assert_shape(initializers.init_rows(1, 0, rows[:0], 3, 0.1), (0, 3))
  # The spread is computed in float64 whatever the stddevs' dtype (the values any run gives).
  chex.assert_trees_all_equal(
      initializers.init_rows(1, 0, rows, 3, stddevs.astype(np.float32)),
      initializers.init_rows(1, 0, rows, 3, stddevs.astype(np.float32).astype(np.float64)))


def test_seed_table_and_row_all_matter():
  rows = np.arange(8, dtype=np.int64)
  base = initializers.init_rows(3, 0, rows, 4, 0.1)
  for other in (initializers.init_rows(4, 0, rows, 4, 0.1), initializers.init_rows(3, 1, rows, 4, 0.1)):
    assert not np.any(other == base)
  assert len({tuple(r) for r in base}) == 8  # distinct rows
  # A wider row extends a narrower one (columns are separate counters).
  chex.assert_trees_all_equal(initializers.init_rows(3, 0, rows, 6, 0.1)[:, :4], base)


def test_init_rows_spread_matches_stddev():
  values = initializers.init_rows(0, 0, np.arange(20_000, dtype=np.int64), 8, 0.05)
  assert abs(values.std() - 0.05) < 0.05 * 0.02  # 160k samples: std error ~0.2 %
  assert abs(values.mean()) < 0.05 * 0.02
  assert np.abs(values).max() <= 0.05 * np.sqrt(3.0)  # uniform half-width
  zero = initializers.init_rows(0, 0, np.arange(3), 2, 0.0)
  chex.assert_trees_all_equal(zero, np.zeros((3, 2), np.float32))


def _hash_uniform(seed, stream, keys, width):
  return initializers._uniform_block(initializers._stream_base(seed, stream), keys, width)


def test_hash_uniform_in_unit_interval():
  u = _hash_uniform(1, 2, np.arange(5000, dtype=np.uint64), 4)
  chex.assert_shape(u, (5000, 4))
  assert u.dtype == np.float64
  assert u.min() >= 0.0 and u.max() < 1.0
  assert abs(u.mean() - 0.5) < 0.01
  # Stream and seed select independent values; the key is reduced mod 2**64 in either dtype.
  assert not np.any(_hash_uniform(1, 3, np.arange(5000), 4) == u)
  chex.assert_trees_all_equal(_hash_uniform(1, 2, np.arange(5000, dtype=np.int64), 4), u)
  chex.assert_trees_all_equal(_hash_uniform(-1, 2, np.arange(3), 1),
                              _hash_uniform(2**64 - 1, 2, np.arange(3), 1))


def test_init_table_rows_gives_each_table_its_stddev_and_slots():
  tables = initializers.TableInits(np.array([0, 10, 30]), np.array([0.1, 0.5, 0.02]),
                                   np.array([[0.1, 0.1], [0.3, 0.0], [0.0, 0.0]], np.float32))
  rows = np.array([29, 0, 10, 35, 9, 30], np.int64)
  values, slots = initializers.init_table_rows(7, rows, 4, tables)
  table = np.array([1, 0, 1, 2, 0, 2])
  for i, t in enumerate(table):
    want = initializers.init_rows(7, 0, rows[i:i + 1], 4, float(tables.stddevs[t]))
    chex.assert_trees_all_equal(values[i:i + 1], want)  # a one-table run's row, its stddev
    np.testing.assert_array_equal(slots[i], tables.slot_rows[t])
  # Spread follows each table's stddev (uniform: |x| <= stddev * sqrt(3)).
  big = initializers.init_table_rows(1, np.arange(40), 64, tables)[0]
  for (lo, hi), sd in zip([(0, 10), (10, 30), (30, 40)], tables.stddevs, strict=True):
    assert np.abs(big[lo:hi]).max() <= sd * np.sqrt(3) + 1e-7
    assert abs(big[lo:hi].std() - sd) < 0.1 * sd


def test_host_table_initialises_each_table_lazily_and_records_it(tmp_path):
  tables = initializers.TableInits(np.array([0, 4]), np.array([0.2, 0.05]),
                                   np.array([[0.0], [0.3]], np.float32))
  want = initializers.init_table_rows(5, np.arange(9), 3, tables)
  ram = host_table.HostTable.create_ram(9, 3, 1, seed=5, init_stddev=1.0,
                                        initial_slot_row=[0.0], tables=tables)
  chex.assert_trees_all_equal(ram.gather(np.arange(9)), want)
  mm = host_table.HostTable.create_mmap(str(tmp_path / "t"), 9, 3, 1, seed=5, init_stddev=1.0,
                                        initial_slot_row=[0.0], tables=tables)
  mm.close()
  reopened = host_table.HostTable.open_mmap(str(tmp_path / "t"))  # meta.json keeps the tables
  chex.assert_trees_all_equal(reopened.gather(np.array([8, 0, 3, 4])),
                              tuple(x[[8, 0, 3, 4]] for x in want))
  reopened.close()


def test_init_table_rows_zeroes_the_columns_past_a_tables_dim():
  # 4 latent columns + 1 first-order; table 0 of dim 2, table 1 of the model's dim (0), table 2
  # of dim 4 (= latent: every column), table 3 of dim 1.
  tables = initializers.TableInits(np.array([0, 5, 9, 12]), np.full(4, 0.3),
                                   np.zeros((4, 1), np.float32), np.array([2, 0, 4, 1]), 4)
  rows = np.arange(16, dtype=np.int64)
  values, _ = initializers.init_table_rows(3, rows, 5, tables)
  full, _ = initializers.init_table_rows(3, rows, 5, tables._replace(dims=None))
  want = full.copy()
  want[0:5, 2:4] = 0.0
  want[12:16, 1:4] = 0.0
  chex.assert_trees_all_equal(values, want)
  assert (full[0:5, 2:4] != 0).all() and (full[12:, 1:4] != 0).all()  # the live columns kept
