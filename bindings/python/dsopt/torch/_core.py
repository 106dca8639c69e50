"""What the parts of ``dsopt.torch.Optimizer`` share: ``Facts``, what the
optimizer is (fixed at creation, from the algorithm's description), and
``OptimizerCore``, the one base that declares every attribute and method
the mixins (``RebuildMixin``, ``StateDictMixin``, ``TorchStateMixin``)
use. ``Optimizer`` (``_optimizer.py``) defines them; a mixin uses nothing
else of it."""

from dataclasses import dataclass

from ..algorithms import Algorithm, describe
from . import _groups

# The config key whose value is the weight-decay mode of torch's Adam
# family (True: decoupled, as AdamW). Where an algorithm has it, its torch
# counterparts are torch.optim.Adam / AdamW and their groups'
# ``decoupled_weight_decay`` (torch >= 2.6) must agree with it.
WEIGHT_DECAY_MODE_KEY = "adam_w_mode"


@dataclass(frozen=True)
class Facts:
    """What a dsopt.torch optimizer is, from its canonical config.

    ``algorithm``: its description (``dsopt.describe``), whose flags decide
    what the optimizer can do (``param_steps``: add groups after the first
    step, carry state into a rebuild, torch.optim state dicts;
    ``compressed``: the 1-bit settings); ``hyper``: its group
    hyperparameters (``_groups.Hyper``); ``decoupled``: the weight-decay
    mode where the algorithm has one (``WEIGHT_DECAY_MODE_KEY``), else
    None; ``zero_stage``: 0, 1 or 2."""

    algorithm: Algorithm
    hyper: _groups.Hyper
    decoupled: object
    zero_stage: int

    @property
    def type(self) -> str:
        return self.algorithm.type

    @classmethod
    def of(cls, canonical):
        optimizer = canonical["optimizer"]
        algorithm = describe(optimizer["type"])
        decoupled = None
        if WEIGHT_DECAY_MODE_KEY in algorithm.keys:
            decoupled = bool(optimizer["params"].get(WEIGHT_DECAY_MODE_KEY, True))
        return cls(algorithm, _groups.hyper(algorithm.type), decoupled,
                   int(canonical["zero_optimization"]["stage"]))


class OptimizerCore:
    """The attributes and methods of ``dsopt.torch.Optimizer`` that its
    mixins work on (``Optimizer.__init__`` and ``_set_up`` set them).

    Besides torch's own ``param_groups``, ``defaults`` and ``state`` (the
    ``LiveState``), and the public ``dsopt`` (the ``dsopt.Optimizer``),
    ``overlap`` and ``last_step_info``:

    * ``_facts``: ``Facts``, what the optimizer is;
    * ``_config`` (the dsopt config without ``param_groups``), ``_comm``
      and ``_owns_comm``: what its dsopt optimizer is created from;
    * ``_tensors`` (the parameters in dsopt's order; FSDP2's DTensors,
      whose local shards dsopt updates, with ``_shards`` their
      ``_dtensor.ShardedParams``), ``_storage`` (their
      storage as dsopt has it, a ``ParamStorage``) and
      ``_grad_descriptors`` (the last step's gradient descriptors);
    * ``_handed_over`` (some gradient of this step was handed over) and
      ``_hooked`` (overlap through hooks): the overlap state.
    """

    _facts: Facts
    _shards: object  # FSDP2's parameters (_dtensor.ShardedParams), or None

    def _dsopt_params(self, tensors=None):
        """What dsopt updates for the parameters (FSDP2's local shards)."""
        raise NotImplementedError

    def _set_up(self, tensors):
        """Takes ``tensors`` (dsopt's parameters, in its order) as they are
        after a rebuild: storage, indices, views, gather buckets."""
        raise NotImplementedError

    def _hook(self, indices):
        """overlap: hooks the parameters ``indices``."""
        raise NotImplementedError

    def _sync_hyperparameters(self):
        """Hands every group's changed hyperparameters to dsopt."""
        raise NotImplementedError

    def _reset_hyperparameters(self):
        """Takes the groups' hyperparameters as dsopt has them now (after
        the groups or dsopt's optimizer were replaced)."""
        raise NotImplementedError

    def _normalize_groups(self):
        """Gives every group the keys torch's groups have, each checked."""
        raise NotImplementedError

    def _init_optimizer(self, *args, **kwargs):
        """``Optimizer.__init__`` (what copies and unpickling make one with)."""
        raise NotImplementedError

    def _follow_params(self, collective=True):
        """Points dsopt at the parameters' current storage (``RebuildMixin``)."""
        raise NotImplementedError
