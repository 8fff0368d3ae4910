"""The planner's id -> slot hash map."""

import numpy as np

from sfjax.embedding import slot_index


def test_id_index_survives_rebuilds_and_tombstones():
  rng = np.random.default_rng(0)
  index = slot_index.IdIndex(64)
  held = {}  # slot -> id
  for _ in range(200):
    if held:
      gone = rng.choice(list(held), size=min(len(held), int(rng.integers(0, 20))), replace=False)
      index.remove_slots(np.asarray(gone, np.int64))
      for s in gone:
        del held[s]
    free = [s for s in range(64) if s not in held]
    new_slots = rng.choice(free, size=int(rng.integers(0, len(free) + 1)), replace=False)
    taken = set(held.values())
    new_ids = [i for i in rng.choice(10**15, size=3 * new_slots.size) if i not in taken]
    new_ids = np.unique(new_ids)[:new_slots.size]
    new_slots = new_slots[:new_ids.size]
    index.insert(new_ids.astype(np.int64), new_slots.astype(np.int32))
    held.update(zip(new_slots.tolist(), new_ids.tolist(), strict=True))
    probe = np.array(list(held.values()) + [10**15 + 1], np.int64)
    assert index.lookup(probe).tolist() == list(held) + [-1]


def test_dense_index_answers_like_the_hash_map():
  rng = np.random.default_rng(3)
  num_slots, num_rows = 64, 500
  dense, hashed = slot_index.DenseIdIndex(num_slots, num_rows), slot_index.IdIndex(num_slots)
  held = {}  # slot -> id
  for _ in range(40):
    free = [s for s in range(num_slots) if s not in held]
    out = rng.choice(sorted(held), size=min(len(held), int(rng.integers(0, 10))), replace=False) \
        if held else np.zeros(0, np.int64)
    for index in (dense, hashed):
      index.remove_slots(np.asarray(out, np.int64))
    for s in out:
      del held[int(s)]
    free = [s for s in range(num_slots) if s not in held]
    absent = np.setdiff1d(np.arange(num_rows), list(held.values()))
    k = min(len(free), int(rng.integers(0, 12)))
    ids = rng.choice(absent, size=k, replace=False).astype(np.int64)
    slots = np.asarray(free[:k], np.int32)
    for index in (dense, hashed):
      index.insert(ids, slots)
    held.update(zip(slots.tolist(), ids.tolist(), strict=True))
    probe = rng.integers(0, num_rows, 50).astype(np.int64)
    want = np.array([{v: k for k, v in held.items()}.get(int(i), -1) for i in probe])
    np.testing.assert_array_equal(dense.lookup(probe), want)
    np.testing.assert_array_equal(hashed.lookup(probe), want)
    assert dense.lookup(probe).dtype == np.int64


def test_dense_index_remembers_the_step_that_last_evicted_each_absent_id():
  index = slot_index.DenseIdIndex(4, 20)
  index.insert(np.array([3, 7, 11], np.int64), np.array([0, 1, 2], np.int32))
  index.remove_slots(np.array([0, 2]), step=5)  # ids 3 and 11 evicted at step 5
  index.insert(np.array([12], np.int64), np.array([0], np.int32))
  index.remove_slots(np.array([0]), step=9)  # id 12 evicted at step 9
  index.insert(np.array([11], np.int64), np.array([3], np.int32))  # 11 back in: held again
  index.remove_slots(np.array([1]))  # id 7 removed, no step recorded
  probe = np.array([3, 7, 11, 12, 0, 19], np.int64)
  slots, evicted = index.probe(probe)
  assert slots.tolist() == [-1, -1, 3, -1, -1, -1]
  assert evicted.tolist() == [5, -1, -1, 9, -1, -1]  # held (11) and never-held ids: -1
  assert slots.dtype == evicted.dtype == np.int64
  np.testing.assert_array_equal(index.lookup(probe), slots)
  index.remove_slots(np.array([3]), step=0)  # step 0 is a step (not "none")
  assert index.probe(np.array([11]))[1].tolist() == [0]


def test_lru_queue_passes_over_kept_slots_and_keeps_them_queued():
  queue = slot_index.LruQueue(16)
  last_used = np.zeros((6,), np.int64)
  queue.push(np.arange(6), 0, last_used)
  hits, keep = np.zeros((6,), bool), np.zeros((6,), bool)
  hits[0], keep[[1, 3]] = True, True
  victims, head = queue.find(2, last_used, 1, hits, keep)
  assert victims.tolist() == [2, 4] and head == 1  # the head stops at kept slot 1
  victims, head = queue.find(2, last_used, 1, hits)  # no keep mask: the plain order
  assert victims.tolist() == [1, 2] and head == 3
  assert queue.find(5, last_used, 1, hits, keep) == (None, 3)  # slots 2, 4, 5 only
  assert queue.find(1, last_used, 0, hits, keep) == (None, 0)  # all in flight


def test_lru_queue_search_goes_on_past_its_first_chunk():
  queue = slot_index.LruQueue(8192)
  last_used = np.zeros((3000,), np.int64)
  queue.push(np.arange(3000), 0, last_used)
  hits = np.zeros((3000,), bool)
  hits[:2500] = True  # more than one chunk (2k + 1024 entries) to pass over
  keep = np.zeros((3000,), bool)
  keep[2600] = True
  victims, head = queue.find(2, last_used, 1, hits, keep)
  assert victims.tolist() == [2500, 2501] and head == 2502
  victims, head = queue.find(150, last_used, 1, hits, keep)
  assert victims.tolist() == [*range(2500, 2600), *range(2601, 2651)] and head == 2600
