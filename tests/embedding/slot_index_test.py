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
