"""Background stage: ordering, failure propagation, clean shutdown."""

import os
import sys
import threading
import time
import traceback

import pytest

from sfjax.core import background


def test_yields_in_order_and_stops():
  assert list(background.BackgroundIterator(range(50), maxsize=3)) == list(range(50))
  assert list(background.map_in_background(lambda x: x * x, range(5))) == [0, 1, 4, 9, 16]


def _boom_source():
  yield 1
  yield 2
  raise KeyError("bad record 3")


def test_exception_reraised_with_original_traceback():
  it = background.BackgroundIterator(_boom_source(), maxsize=1, name="loader")
  assert next(it) == 1 and next(it) == 2
  with pytest.raises(KeyError, match="bad record 3") as info:
    next(it)
  frames = "".join(traceback.format_tb(info.value.__traceback__))
  assert "_boom_source" in frames
  with pytest.raises(StopIteration):
    next(it)


def test_close_unblocks_a_producer_on_a_full_queue():
  closed = threading.Event()

  def endless():
    try:
      i = 0
      while True:
        yield i
        i += 1
    finally:
      closed.set()

  it = background.BackgroundIterator(endless(), maxsize=1)
  assert next(it) == 0
  time.sleep(0.05)  # let the producer block on the full queue
  it.close()
  assert closed.wait(5.0), "generator was not closed"
  assert not it._thread.is_alive()


def test_context_manager_and_bad_maxsize():
  with background.BackgroundIterator(iter(range(100)), maxsize=2) as it:
    assert next(it) == 0
  assert not it._thread.is_alive()
  with pytest.raises(ValueError, match="maxsize"):
    background.BackgroundIterator([], maxsize=0)


def _niceness() -> int:
  return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness is Linux's")
def test_a_nice_stage_lowers_its_own_thread_only():
  before = _niceness()
  seen = list(background.map_in_background(lambda _: _niceness(), range(3), nice=7))
  assert seen == [max(7, before)] * 3
  assert list(background.map_in_background(lambda _: _niceness(), range(2))) == [before] * 2
  assert _niceness() == before  # the consumer's thread is untouched
  with pytest.raises(ValueError, match=r"nice must be in \[0, 19\] or IDLE \(20\), got 21"):
    background.BackgroundIterator(range(3), nice=21)
  with pytest.raises(ValueError, match=r"got -1"):
    background.BackgroundIterator(range(3), nice=-1)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_IDLE is Linux's")
def test_an_idle_stage_runs_under_sched_idle_and_the_consumer_does_not():
  def policy(_):
    return os.sched_getscheduler(threading.get_native_id())

  before = policy(None)
  assert list(background.map_in_background(policy, range(3), nice=background.IDLE)) == [
      os.SCHED_IDLE] * 3
  assert policy(None) == before != os.SCHED_IDLE
  assert list(background.map_in_background(policy, range(2), nice=19)) == [before] * 2
