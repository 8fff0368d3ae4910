"""AutoGroup: learned feature groups and order-p interactions inside them.

Liu et al., SIGIR 2020. For each interaction order p in 2..max_order there are
G_p groups; field i belongs to group j of order p by a binary choice with
structure logits π^p_ij, sampled by a straight-through Gumbel-softmax; the
interactions inside each group feed an MLP tower. The model is the registered
`group_interactions` (`sfjax.models.group_interactions`, which gives the formulas).

It trains through the shared train step (`gate_training`): on every batch one
update of everything, the network by Adam, the structure logits by Adam at
`structure_lr` (one `optax.multi_transform`), the embedding rows by the row
optimizer, on one Gumbel sample (the paper alternates a structure update and a
weight update on each batch; the shared step makes them one joint update). Evaluation uses the hard memberships argmax π
without noise, which are the searched result. `retrain_with_groups` trains the
same model with fixed groups: what a grouping is worth by itself.

Data and metrics as in `sfjax.structure.autofis`: the task's `TrialData`,
exact AUC / logloss on the valid (first) and test (second) halves of its eval rows.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from sfjax.cohorts.task import CTRTask, TrialData
from sfjax.models.group_interactions import GroupInteractions
from sfjax.structure import gate_training as st
from sfjax.train import optimizers


@dataclasses.dataclass(frozen=True)
class AutoGroupSettings:
  """AutoGroup settings.

  Attributes:
    embed_dim: E (the table holds E + 1 columns: the last is the first-order weight).
    max_order: highest interaction order P >= 2 (orders 2..P are searched).
    num_groups: G_p per order: one int for every order, or a tuple of P - 1 ints.
    mlp_dims: hidden widths of the tower (() = a linear layer).
    steps: train steps (each one structure update and one weight update).
    batch_size: examples per step (0 = the task's).
    eval_rows: eval examples, split into valid and test halves (0 = the task's).
    dense_lr: Adam learning rate of the network weights.
    embedding_lr: learning rate of the embedding rows.
    embedding_optimizer: row optimizer of the embeddings.
    structure_lr: Adam learning rate of the structure logits.
    temperature: Gumbel-softmax temperature τ.
    init_stddev: standard deviation of the initial embedding rows.
    seed: parameter and sampling seed (the data seed is the task's).
  """

  embed_dim: int = 8
  max_order: int = 3
  num_groups: int | tuple = 4
  mlp_dims: tuple = (64,)
  steps: int = 1500
  batch_size: int = 0
  eval_rows: int = 0
  dense_lr: float = 3e-3
  embedding_lr: float = 0.05
  embedding_optimizer: str = "adagrad"
  structure_lr: float = 0.01
  temperature: float = 1.0
  init_stddev: float = 0.05
  seed: int = 0

  def __post_init__(self):
    st.check_structure_settings(self, ints={"max_order": 2, "steps": 1},
                      floats={"structure_lr": (0.0, False), "temperature": (0.0, False)},
                      tuples=("mlp_dims", "num_groups"))
    groups = self.num_groups if isinstance(self.num_groups, tuple) else (self.num_groups,) * (self.max_order - 1)
    if len(groups) != self.max_order - 1:
      raise ValueError(f"AutoGroupSettings.num_groups must have max_order - 1 = {self.max_order - 1} "
                       f"entries (orders 2..{self.max_order}), got {self.num_groups!r}")
    for g in groups:
      st.check_int("AutoGroupSettings", "num_groups", g, 1)

  @property
  def orders(self) -> tuple[int, ...]:
    """The searched orders 2..max_order."""
    return tuple(range(2, self.max_order + 1))

  @property
  def groups_per_order(self) -> tuple[int, ...]:
    """G_p for each order in `orders`."""
    if isinstance(self.num_groups, tuple):
      return self.num_groups
    return (self.num_groups,) * (self.max_order - 1)


@dataclasses.dataclass(frozen=True)
class AutoGroupResult:
  """What an AutoGroup run found.

  Attributes:
    orders: the searched orders (2..max_order).
    memberships: per order, [F, G_p] bool hard field -> group assignment (argmax π).
    field_names: the F field names.
    valid_auc, valid_logloss: the model on the valid half of the eval rows.
    test_auc, test_logloss: on the test half (never used to select).
    steps: train steps; wall_s: seconds of the run.
  """

  orders: tuple
  memberships: tuple
  field_names: tuple
  valid_auc: float
  valid_logloss: float
  test_auc: float
  test_logloss: float
  steps: int
  wall_s: float

  def groups(self, order: int) -> tuple[tuple[int, ...], ...]:
    """The fields of each group of `order` (a field may be in several groups or none)."""
    if order not in self.orders:
      raise ValueError(f"order {order} was not searched (orders: {self.orders})")
    member = np.asarray(self.memberships[self.orders.index(order)], bool)
    return tuple(tuple(int(f) for f in np.flatnonzero(member[:, g])) for g in range(member.shape[1]))

  def to_json(self) -> dict:
    """A JSON-serialisable dict: per order its groups as lists of field indices, and the metrics."""
    return {"orders": list(self.orders),
            "groups": {str(p): [list(g) for g in self.groups(p)] for p in self.orders},
            "field_names": list(self.field_names),
            **{k: float(getattr(self, k)) for k in ("valid_auc", "valid_logloss", "test_auc", "test_logloss",
                                                    "wall_s")},
            "steps": int(self.steps)}

  @classmethod
  def from_json(cls, record: dict) -> AutoGroupResult:
    """The result written by `to_json`."""
    keys = ("orders", "groups", "field_names", "valid_auc", "valid_logloss", "test_auc", "test_logloss",
            "steps", "wall_s")
    missing = [k for k in keys if k not in record]
    if missing:
      raise ValueError(f"AutoGroup result record lacks {missing}")
    num_fields = len(record["field_names"])
    memberships = []
    for p in record["orders"]:
      groups = record["groups"][str(p)]
      member = np.zeros((num_fields, len(groups)), bool)
      for g, fields in enumerate(groups):
        member[list(fields), g] = True
      memberships.append(member)
    return cls(orders=tuple(int(p) for p in record["orders"]), memberships=tuple(memberships),
               field_names=tuple(record["field_names"]),
               **{k: record[k] for k in keys[3:]})


def _optimizer(settings: AutoGroupSettings, train_structure: bool) -> optax.GradientTransformation:
  """Adam on the network and (`train_structure`) Adam on the structure logits, else they stay."""
  structure = (optimizers.dense_optimizer("adam", settings.structure_lr) if train_structure
               else None)
  return st.group_optimizer({"net": optimizers.dense_optimizer("adam", settings.dense_lr),
                             "structure": structure}, default="net")


@functools.lru_cache(maxsize=16)
def _runner(graphdef: nnx.GraphDef, settings: AutoGroupSettings, train_structure: bool,
            compiler_options: tuple[tuple[str, str], ...] = ()):
  """The jitted runner (compiled with the task's `compiler_options`); cached so runs that
  differ only by seed or steps share it (`settings` arrives with those fields zeroed)."""
  return st.make_runner(graphdef, _optimizer(settings, train_structure),
                        st.row_optimizer(settings), compiler_options)


def _model(data: TrialData, settings: AutoGroupSettings) -> GroupInteractions:
  return GroupInteractions(  # the registry's "group_interactions"
      num_fields=data.spec.num_fields, embed_dim=settings.embed_dim,
      num_dense=data.spec.num_dense, rngs=nnx.Rngs(settings.seed), max_order=settings.max_order,
      num_groups=settings.groups_per_order, mlp_dims=settings.mlp_dims,
      temperature=settings.temperature)


def _train(data: TrialData, settings: AutoGroupSettings, model: nnx.Module,
           train_structure: bool):
  """`settings.steps` steps of `model` (its graph as it is: sampling or fixed groups), behind
  the data set's feature layout if it has one (`gate_training.with_layout`)."""
  model = st.with_layout(model, data.spec)
  graphdef = nnx.graphdef(model)
  key = dataclasses.replace(settings, seed=0, steps=1, batch_size=0, eval_rows=0)
  state = st.init_state(model, _optimizer(settings, train_structure), st.row_optimizer(settings),
                        data.num_rows, seed=settings.seed, init_stddev=settings.init_stddev)
  runner = _runner(graphdef, key, train_structure, data.task.compiler_options)
  state, _ = st.train(state, data, runner, 0, settings.steps)
  return state, graphdef


def run_autogroup(task: CTRTask, settings: AutoGroupSettings,
                  data: TrialData | None = None) -> AutoGroupResult:
  """Trains AutoGroup (structure and weights together) and reads off the groups.

  Args:
    task: the CTR task (its batch size and eval rows unless `settings` overrides them).
    settings: AutoGroup settings.
    data: the task's TrialData if already built.

  Returns:
    AutoGroupResult.
  """
  t0 = time.perf_counter()
  data = data if data is not None else st.prepare_trial_data(task, settings)
  state, graphdef = _train(data, settings, _model(data, settings), train_structure=True)
  eval_graphdef = st.eval_graphdef(graphdef, state.params)
  metrics = st.split_metrics(data, st.host_eval_logits(eval_graphdef, state, data))
  found = st.unwrap(nnx.merge(eval_graphdef, state.params)).memberships()
  return AutoGroupResult(orders=settings.orders,
                         memberships=tuple(np.asarray(m) > 0 for m in found),
                         field_names=tuple(f.name for f in data.spec.fields), **metrics,
                         steps=settings.steps, wall_s=time.perf_counter() - t0)


def retrain_with_groups(data: TrialData, settings: AutoGroupSettings,
                        memberships) -> dict[str, float]:
  """A fresh model whose groups are fixed to `memberships`, trained `settings.steps` steps.

  The same model, seed and steps as `run_autogroup`, but the memberships neither
  sampled nor trained: what a grouping is worth by itself (the searched one, or a
  random one to compare it with).

  Args:
    data: the task's TrialData.
    settings: AutoGroup settings.
    memberships: per order, [F, G_p] bool field -> group assignment.

  Returns:
    {'valid_auc', 'valid_logloss', 'test_auc', 'test_logloss'}.

  Raises:
    ValueError: naming `memberships` when the shapes are not the settings' groups.
  """
  want = [(data.spec.num_fields, g) for g in settings.groups_per_order]
  got = [np.shape(m) for m in memberships]
  if got != want:
    raise ValueError(f"memberships: shapes {got}, expected {want} (fields x groups per order)")
  model = _model(data, settings)
  model.eval()  # argmax memberships, no Gumbel noise, in training too
  for logits, member in zip(model.structure, memberships, strict=True):
    logits[...] = jnp.stack([~np.asarray(member, bool), np.asarray(member, bool)], axis=-1) * 1.0
  state, graphdef = _train(data, settings, model, train_structure=False)
  return st.split_metrics(data, st.host_eval_logits(graphdef, state, data))
