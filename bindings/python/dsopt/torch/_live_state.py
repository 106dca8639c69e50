"""``optimizer.state`` of dsopt.torch: a live view of dsopt's own state.

``LiveState`` is the mapping ``opt.state`` (parameter -> dict), shaped like
torch.optim's ``defaultdict(dict)``: a parameter that dsopt has updated
(``param_step(i) > 0``) maps to a ``ParamState``::

    {"step": tensor(12.),             # 0-d tensor, a copy (float32;
                                      # float64 under a float64 default)
     "exp_avg": <view>, "exp_avg_sq": <view>,
     "master": <view>,                # 16-bit parameters: the fp32 masters
     "worker_error": <view>, ...}     # the 1-bit optimizers' own names
                                      # (dsopt.state_names(), at each access)

Each ``<view>`` is an fp32 torch tensor on dsopt's memory (no copy; a
CUDA tensor through ``__cuda_array_interface__`` for device state),
shaped like the parameter; under ZeRO stage 1/2 a flat tensor holding the
part of the parameter in this rank's shard, elements ``"offset"`` ..
``"offset" + numel - 1`` of the flattened parameter (``"offset"`` is in the
dict). In-place writes (``state["exp_avg"].zero_()``, ``[mask] = 0``)
change dsopt's state; so does assigning a tensor to such a key (copied in);
assigning ``"step"`` sets the parameter's step count (where parameters
count their own steps: ``dsopt.describe(type).param_steps``). Do it
between steps. Other keys are kept here for the parameter, as torch keeps
what code stores in ``state[p]``. A parameter never updated has no entry
(``p in opt.state`` is False), as in torch; reading ``opt.state[p]`` then
gives its (initially empty) dict of other keys, as torch's defaultdict
does. A view belongs to the dsopt optimizer it was made on:
``add_param_group`` makes a new one, so read ``opt.state[p]`` again after
it. In one process an old view keeps the old optimizer (and its memory)
alive, no longer updated; on several ranks the old optimizer is destroyed
(collectively) and an old view, like one kept past ``close()``, points
into freed memory. ``deepcopy``, ``copy`` and pickles of the mapping are
plain dicts (snapshots).
"""

import torch

from ..errors import InvalidArgument


# The state names a parameter may lack (1-bit Adam's non_freeze groups, the
# 1-bit optimizers before their compression stage); every other name of
# dsopt.state_names() has a view of every parameter, except a ZeRO
# parameter split by the reduce buckets.
OPTIONAL_NAMES = ("worker_error", "exp_avg_sq_fresh")


def no_view_error(i, name, error):
    """The ValueError for a required state tensor dsopt gives no view of."""
    return ValueError(
        f"dsopt.torch: parameter {i}'s state {name!r} has no view ({error}); under ZeRO a "
        f"parameter split by the reduce buckets cannot be viewed as one tensor (make "
        f"\"reduce_bucket_size\" at least the largest parameter). Nothing was changed.")


def _step_dtype():
    """torch's dtype of ``state["step"]`` (torch >= 1.12: float32, float64
    under a float64 default dtype)."""
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def view_tensor(view, param, shaped):
    """The torch tensor on a ``dsopt.StateView`` (no copy): shaped like
    ``param`` when ``shaped`` (the view covers the whole parameter), else
    flat."""
    data = view.data
    if view.on_device:
        device = param.device if param.is_cuda else torch.device("cuda")
        if data.shape[0] == 0:
            tensor = torch.empty(0, dtype=torch.float32, device=device)
        else:
            tensor = torch.as_tensor(data, device=device)
    else:
        tensor = torch.from_numpy(data)
    return tensor.view(param.shape) if shaped else tensor


class ParamState(dict):
    """One parameter's entry of ``LiveState`` (see the module doc): a dict
    whose dsopt keys write through to dsopt when assigned."""

    __slots__ = ("_live", "_index")

    def __init__(self, live, index, values):
        super().__init__(values)
        self._live = live
        self._index = index

    def __setitem__(self, key, value):
        live, i = self._live, self._index
        if key in live.views(i)[0]:
            target = dict.__getitem__(self, key)
            value = torch.as_tensor(value)
            if value.numel() != target.numel() and value.numel() == live.param(i).numel() and \
                    "offset" in self:
                offset = dict.__getitem__(self, "offset")  # a whole parameter: this rank's part
                value = value.reshape(-1)[offset:offset + target.numel()]
            if value.numel() != target.numel():
                raise ValueError(f"state[{key!r}] has {target.numel()} elements here; got a "
                                 f"tensor of {value.numel()}")
            with torch.no_grad():
                target.copy_(value.reshape(target.shape))
            return
        if key == "step":
            step = float(value)
            if not step >= 0 or step != int(step):
                raise ValueError(f"state['step'] must be a whole number >= 0, got {step}")
            live.owner.dsopt.set_param_step(i, int(step))
            super().__setitem__("step", torch.tensor(step, dtype=_step_dtype()))
            return
        if key == "offset":
            if "offset" in self and value == dict.__getitem__(self, "offset"):
                return  # written back unchanged (as Lightning moves state to a device)
            raise ValueError("state['offset'] is where dsopt's shard of the parameter starts; "
                             "it cannot be changed")
        live.extras_of(live.param(i))[key] = value
        super().__setitem__(key, value)

    def __delitem__(self, key):
        if key in self._live.views(self._index)[0] or key in ("step", "offset"):
            raise ValueError(f"state[{key!r}] is dsopt's own state and cannot be deleted")
        del self._live.extras_of(self._live.param(self._index))[key]
        super().__delitem__(key)

    def update(self, *args, **kwargs):
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def pop(self, key, *default):
        if key not in self and default:
            return default[0]
        value = self[key]
        del self[key]
        return value

    def __reduce__(self):  # copies and pickles are plain dicts (a snapshot)
        return (dict, (dict(self),))


class LiveState(dict):
    """``opt.state``: see the module doc. The dict itself holds only the
    other keys code stored per parameter (torch's defaultdict behaviour);
    dsopt's state is read from dsopt on each access."""

    def __init__(self, owner, sharded, fsdp=None):
        super().__init__()
        self.owner = owner  # the dsopt.torch optimizer: its ``dsopt``, read at each access
        self._sharded = sharded  # ZeRO stage 1/2: views of this rank's shard
        # FSDP2's parameters (a _dtensor.ShardedParams): views of the local
        # shards, as DTensors placed like the parameters
        self._fsdp = fsdp
        self._tensors, self._index = [], {}
        self._views = {}

    def track(self, tensors, index):
        """The parameters in dsopt's order and {parameter: its index}, set by
        the optimizer at creation and again after each rebuild (which makes
        the cached views stale)."""
        self._tensors, self._index = tensors, index
        self.invalidate()

    # ---- what dsopt has --------------------------------------------------

    def invalidate(self):
        """Forgets the cached views: every path that loads dsopt's state or
        rebuilds the dsopt optimizer calls it (a 1-bit optimizer's
        ``worker_error`` lives only until the next state load, and a
        rebuilt optimizer has views of its own)."""
        self._views = {}

    def param(self, i):
        return self._tensors[i]

    def index_of(self, key):
        return self._index.get(key) if isinstance(key, torch.Tensor) else None

    def view_names(self, i):
        """The names of dsopt's state tensors (``dsopt.state_names()``, which
        can grow: the 1-bit optimizers' ``worker_error`` exists from their
        compression stage on, at several ranks); ``master`` only for a
        16-bit parameter."""
        names = self.owner.dsopt.state_names()
        if self.param(i).dtype == torch.float32:
            return [n for n in names if n != "master"]
        return names

    def views(self, i, strict=False):
        """({name: tensor on dsopt's memory}, the offset under ZeRO or
        None) of parameter ``i``; an optional name this parameter lacks
        (the ``worker_error`` of a ``non_freeze`` group) is left out. Any
        other name dsopt gives no view of (a ZeRO parameter split by the
        reduce buckets) is left out too, or with ``strict`` raises
        ValueError."""
        owner, p, sharded = self.owner, self.param(i), self._sharded
        cache = self._views.setdefault(i, {})
        tensors, offset = {}, None
        fsdp = self._fsdp
        for name in self.view_names(i):
            cached = cache.get(name)
            if cached is None and fsdp is not None and not fsdp.local_shape(p).numel():
                # an empty shard: no element of the tensor here, and no view
                # (unless dsopt lacks the name altogether)
                if name in OPTIONAL_NAMES and not self._has_view(name):
                    continue
                empty = torch.zeros(fsdp.local_shape(p), dtype=torch.float32, device=p.device)
                cached = cache[name] = (fsdp.wrap(p, empty), 0)
            if cached is None:
                try:
                    view = owner.dsopt.state_view(i, name)
                except InvalidArgument as error:
                    if strict and name not in OPTIONAL_NAMES:
                        raise no_view_error(i, name, error) from None
                    continue
                if fsdp is not None:
                    local = view_tensor(view, p._local_tensor, shaped=True)
                    cached = cache[name] = (fsdp.wrap(p, local), view.offset)
                else:
                    cached = cache[name] = (view_tensor(view, p, shaped=not sharded), view.offset)
            tensors[name] = cached[0]
            offset = cached[1]
        return tensors, offset if sharded else None

    def _has_view(self, name):
        """Whether some non-empty parameter has a view ``name`` (for the
        optional names of empty FSDP2 shards)."""
        for k, q in enumerate(self._tensors):
            if self._fsdp.local_shape(q).numel():
                try:
                    self.owner.dsopt.state_view(k, name)
                    return True
                except InvalidArgument:
                    return False
        return False

    def has_state(self, i):
        return self.owner.dsopt.param_step(i) > 0

    def entry(self, i):
        """The ``ParamState`` of parameter ``i`` (which has state)."""
        step = self.owner.dsopt.param_step(i)
        tensors, offset = self.views(i)
        values = {"step": torch.tensor(float(step), dtype=_step_dtype())}
        values.update(tensors)
        if offset is not None:
            values["offset"] = offset
        extras = dict.get(self, self.param(i))
        if extras:
            # dsopt's values win: an other key stored under one of their
            # names before the parameter had state is dropped.
            for key in [k for k in extras if k in values]:
                del extras[key]
            values.update(extras)
        return ParamState(self, i, values)

    def extras_of(self, key):
        extras = dict.get(self, key)
        if extras is None:
            extras = {}
            dict.__setitem__(self, key, extras)
        return extras

    # ---- the mapping -----------------------------------------------------

    def _stepped(self):
        """The parameters with dsopt state, in parameter order."""
        return [p for i, p in enumerate(self._tensors) if self.has_state(i)]

    def keys(self):
        stepped = self._stepped()
        seen = set(map(id, stepped))
        return stepped + [k for k in dict.keys(self) if id(k) not in seen]

    def __iter__(self):
        return iter(self.keys())

    def __len__(self):
        return len(self.keys())

    def __contains__(self, key):
        i = self.index_of(key)
        if i is not None and self.has_state(i):
            return True
        return dict.__contains__(self, key)

    def __getitem__(self, key):
        i = self.index_of(key)
        if i is not None and self.has_state(i):
            return self.entry(i)
        if i is not None:
            return self.extras_of(key)  # defaultdict(dict): created on access
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        return self.extras_of(key)

    def get(self, key, default=None):
        return self[key] if key in self else default

    def items(self):
        return [(k, self[k]) for k in self.keys()]

    def values(self):
        return [self[k] for k in self.keys()]

    def __setitem__(self, key, value):
        i = self.index_of(key)
        if i is not None and self.has_state(i):
            entry = self.entry(i)
            for k, v in dict(value).items():
                entry[k] = v
            return
        dict.__setitem__(self, key, dict(value) if i is not None else value)

    def __delitem__(self, key):
        i = self.index_of(key)
        if i is not None and self.has_state(i):
            raise ValueError("dsopt keeps this parameter's state; it cannot be deleted from "
                             "optimizer.state (load a state dict to replace it)")
        dict.__delitem__(self, key)

    def pop(self, key, *default):
        if key not in self:
            if default:
                return default[0]
            raise KeyError(key)
        value = self[key]
        del self[key]
        return value

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = {} if default is None else default
        return self[key]

    def update(self, *args, **kwargs):
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def clear(self):
        dict.clear(self)

    def copy(self):
        return dict(self.items())

    def __eq__(self, other):
        return dict(self.items()) == other

    __hash__ = None

    def __repr__(self):
        return f"LiveState({dict(self.items())!r})"

    def __reduce__(self):  # copies and pickles are plain dicts (a snapshot)
        return (dict, (dict(self.items()),))

    def __deepcopy__(self, memo):
        import copy
        return copy.deepcopy(dict(self.items()), memo)
