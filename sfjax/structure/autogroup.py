"""AutoGroup: learned feature groups and order-p interactions inside them.

Liu et al., SIGIR 2020. For each interaction order p in 2..max_order there are
G_p groups; field i belongs to group j of order p by a binary choice with
structure logits π^p_ij [2] (a field may join several groups or none). Training
samples the choice by Gumbel-softmax with temperature τ and a straight-through
hard choice: the forward pass uses the hard 0/1 membership m^p_ij, gradients flow
through the soft sample. A group's representation is

  s^p_j = Σ_i m^p_ij w^p_ij e_i                     (w: learned field weights)
  I^p_j = (s^p_j)^p - Σ_i (m^p_ij w^p_ij e_i)^p     (elementwise powers, [E])

(for p = 2 this is twice the FM interaction of the group's fields). The
interaction vectors of every order and group, with the dense features, feed an
MLP tower, added to the first-order terms:

  logit = b + Σ_f w_f + d·dense + MLP([I^2_1, ..., I^P_G, dense]).

Weights and structure are updated alternately: on every batch a structure step
(Adam on π, weights fixed, sampled memberships) then a weight step (Adam on the
network, row optimizer on the embeddings, a fresh sample). Evaluation uses the
hard memberships argmax π without noise, which are the searched result.

Data and metrics as in `sfjax.structure.autofis`: the task's `TrialData`,
exact AUC / logloss on the valid (first) and test (second) halves of its eval rows.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sfjax.cohorts.task import CTRTask, TrialData
from sfjax.structure import gate_training as st


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
    owner = "AutoGroupSettings"
    for name in ("mlp_dims", "num_groups"):
      if isinstance(getattr(self, name), list):
        object.__setattr__(self, name, tuple(getattr(self, name)))
    st.check_common_settings(owner, self)
    st.check_int(owner, "max_order", self.max_order, 2)
    st.check_int(owner, "steps", self.steps, 1)
    groups = self.num_groups if isinstance(self.num_groups, tuple) else (self.num_groups,) * (self.max_order - 1)
    if len(groups) != self.max_order - 1:
      raise ValueError(f"{owner}.num_groups must have max_order - 1 = {self.max_order - 1} entries "
                       f"(orders 2..{self.max_order}), got {self.num_groups!r}")
    for g in groups:
      st.check_int(owner, "num_groups", g, 1)
    st.check_float(owner, "structure_lr", self.structure_lr, 0.0, False)
    st.check_float(owner, "temperature", self.temperature, 0.0, False)

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


def straight_through_membership(logits: jax.Array, key, temperature, train: bool) -> jax.Array:
  """Hard 0/1 memberships [F, G] from structure logits [F, G, 2] (index 1 = member).

  Train: Gumbel-softmax sample y = softmax((π + g) / τ); forward value one_hot(argmax y),
  gradient that of y (straight-through). Eval: one_hot(argmax π), no noise.
  """
  if not train:
    return (jnp.argmax(logits, axis=-1) == 1).astype(jnp.float32)
  gumbel = jax.random.gumbel(key, logits.shape, jnp.float32)
  soft = jax.nn.softmax((logits + gumbel) / temperature, axis=-1)
  hard = jax.nn.one_hot(jnp.argmax(soft, axis=-1), 2, dtype=soft.dtype)
  return (hard + soft - jax.lax.stop_gradient(soft))[..., 1]


def group_interactions(vectors: jax.Array, membership: jax.Array, weights: jax.Array, order: int) -> jax.Array:
  """Order-p interaction vector of each group.

  Args:
    vectors: [B, F, E] field embeddings.
    membership: [F, G] 0/1 (straight-through) memberships.
    weights: [F, G] field weights inside each group.
    order: p >= 2.

  Returns:
    [B, G, E]: (Σ_i m_ig w_ig e_i)^p - Σ_i (m_ig w_ig e_i)^p, elementwise.
  """
  scaled = vectors[:, :, None, :] * (membership * weights)[None, :, :, None]  # [B, F, G, E]
  return scaled.sum(axis=1) ** order - (scaled ** order).sum(axis=1)


def make_forward(settings: AutoGroupSettings):
  """The AutoGroup model as a `structure_training.Forward` (params 'net' and 'structure')."""
  orders = settings.orders

  def forward(params, stats, emb, dense, mask, key, train):
    del mask
    net = params["net"]
    vectors, first = emb[..., :-1], emb[..., -1]  # [B, F, E], [B, F]
    features = []
    for k, p in enumerate(orders):
      member = straight_through_membership(params["structure"][k], jax.random.fold_in(key, k),
                                           settings.temperature, train)
      inter = group_interactions(vectors, member, net["group_weights"][k], p)  # [B, G, E]
      features.append(inter.reshape(inter.shape[0], -1))
    tower = st.mlp_apply(net["mlp"], jnp.concatenate(features + [dense], axis=1))[:, 0]
    return net["bias"] + first.sum(axis=1) + dense @ net["dense_w"] + tower, stats

  return forward


def init_params(settings: AutoGroupSettings, num_fields: int, num_dense: int, key) -> dict:
  """{'net': bias, dense_w, group_weights (per order [F, G]), mlp; 'structure': per order [F, G, 2]}.

  Structure logits start at small random values (N(0, 0.01)), group weights at 1.
  """
  width = sum(g * settings.embed_dim for g in settings.groups_per_order) + num_dense
  net = {"bias": jnp.zeros((), jnp.float32), "dense_w": jnp.zeros((num_dense,), jnp.float32),
         "group_weights": [jnp.ones((num_fields, g), jnp.float32) for g in settings.groups_per_order],
         "mlp": st.mlp_init(jax.random.fold_in(key, 0), (width, *settings.mlp_dims, 1))}
  structure = [0.01 * jax.random.normal(jax.random.fold_in(key, 1 + k), (num_fields, g, 2), jnp.float32)
               for k, g in enumerate(settings.groups_per_order)]
  return {"net": net, "structure": structure}


def _optimizers(settings: AutoGroupSettings):
  return ({"net": optax.adam(settings.dense_lr), "structure": optax.adam(settings.structure_lr)},
          st.row_optimizer(settings))


@functools.lru_cache(maxsize=16)
def _programs(settings: AutoGroupSettings):
  """(forward, jitted runner); cached so runs that differ only by seed or steps share programs
  (`settings` arrives with those fields zeroed)."""
  forward = make_forward(settings)
  optimizers, row_opt = _optimizers(settings)
  phases = [st.Phase(("structure",), False), st.Phase(("net",), True)]
  return forward, st.make_runner(st.make_train_step(forward, optimizers, row_opt, phases))


def run_autogroup(task: CTRTask, settings: AutoGroupSettings, data: TrialData | None = None) -> AutoGroupResult:
  """Trains AutoGroup (alternating structure and weight updates) and reads off the groups.

  Args:
    task: the CTR task (its batch size and eval rows unless `settings` overrides them).
    settings: AutoGroup settings.
    data: the task's TrialData if already built.

  Returns:
    AutoGroupResult.
  """
  t0 = time.perf_counter()
  data = data if data is not None else st.prepare_data(task, settings)
  key = jax.random.key(settings.seed)
  params = init_params(settings, data.spec.num_fields, data.spec.num_dense, jax.random.fold_in(key, 1))
  optimizers, row_opt = _optimizers(settings)
  state = st.init_state(params, (), optimizers, row_opt, data.num_rows, settings.embed_dim + 1,
                        seed=settings.seed, init_stddev=settings.init_stddev)
  forward, runner = _programs(dataclasses.replace(settings, seed=0, steps=1, batch_size=0, eval_rows=0))
  state, _ = st.train(state, data, runner, jax.random.fold_in(key, 2), 0, settings.steps)
  metrics = st.split_metrics(data, st.eval_logits(forward, state, data))
  memberships = tuple(np.asarray(jnp.argmax(s, axis=-1) == 1) for s in state.params["structure"])
  return AutoGroupResult(orders=settings.orders, memberships=memberships,
                         field_names=tuple(f.name for f in data.spec.fields), **metrics,
                         steps=settings.steps, wall_s=time.perf_counter() - t0)
