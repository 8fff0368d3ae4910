"""A check shared by the AutoFIS and AutoGroup tests: their runners are built with the options
of the task's `xla_cpu_dots` (a helper module, not a test file)."""

import copy
import dataclasses

import pytest

EIGEN = (("xla_cpu_experimental_ynn_fusion_type", ""),)


class _Stop(Exception):
  """Ends a run at its first runner (the options it was built with are all the check needs)."""


def assert_runners_follow_xla_cpu_dots(module, run, data, settings, monkeypatch):
  """`run(task, settings, data=...)` of `module` builds its first runner (`module._runner`)
  with each `xla_cpu_dots` choice's compiler options (`data`: the task's TrialData)."""
  for choice, options in (("eigen", EIGEN), ("xla", ())):
    task_data = copy.copy(data)  # the same data, another task setting
    task_data.task = dataclasses.replace(data.task, xla_cpu_dots=choice)
    seen = []

    def runner(graphdef, key, train, compiler_options=(), seen=seen):
      seen.append(compiler_options)
      raise _Stop

    monkeypatch.setattr(module, "_runner", runner)
    with pytest.raises(_Stop):
      run(task_data.task, settings, data=task_data)
    assert seen == [options], choice
