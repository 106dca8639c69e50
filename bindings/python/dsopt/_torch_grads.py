"""The gradient descriptors of dsopt.torch.Optimizer, kept from step to
step (see the dsopt.torch module doc): a parameter's ``.grad`` is
described again only when it is another tensor object than at the last
step; a ``.grad`` that is None is an absent gradient (data NULL).
Unlike ``tensors.GradDescriptors`` (the numpy API's, which holds its
arrays) it keeps weak references: a ``.grad`` torch drops is freed at
once, which matters for GPU memory."""

import operator
import weakref
from itertools import compress, repeat

import numpy as np
import torch

from ._lib import ffi
from .tensors import _ABSENT, describe, tensor_records

_get_dtype = operator.attrgetter("dtype")
_get_layout = operator.attrgetter("layout")
_is, _is_not, _eq = operator.is_, operator.is_not, operator.eq
_deref = weakref.ref.__call__


class _Sentinel:
    pass


_NEVER = _Sentinel()
# refs entries that are no weak reference to a gradient: _NEVER_REF returns
# an object that is no gradient (described again at every step); _NONE_REF
# is dead (returns None: matches a parameter without gradient).
_NEVER_REF = weakref.ref(_NEVER)
_NONE_REF = weakref.ref(_Sentinel())


class TorchGradDescriptors:
    """The ``dsopt_tensor[]`` of the parameters' gradients, kept from step
    to step: entry ``i`` describes ``params[i].grad`` as it was described
    last (``refs[i]`` a weak reference to that tensor), an absent gradient
    (data NULL) of a parameter whose ``.grad`` is None (``refs[i]`` is
    ``_NONE_REF``), or a contiguous copy made for that step only
    (``_NEVER_REF``)."""

    def __init__(self, params, param_records):
        n = len(params)
        self.params = params
        self.c_array = ffi.new("dsopt_tensor[]", max(n, 1))
        self.records = tensor_records(self.c_array)
        # A gradient has its parameter's numel and dtype (torch checks both
        # when .grad is assigned; they are checked again below).
        self.numels = np.array(param_records["numel"][:n], dtype=np.int64)
        self.codes = np.array(param_records["dtype"][:n], dtype=np.int32)
        self.numel_list = self.numels.tolist()
        self.dtypes = [p.dtype for p in params]
        freed = self.freed = [False]

        def on_freed(_ref):
            # A described gradient is gone: its dead reference would match
            # a None .grad, so the next step describes every entry.
            freed[0] = True

        self.on_freed = on_freed
        self.clear()

    def clear(self):
        self.refs = [_NEVER_REF] * len(self.params)
        self.freed[0] = False
        self.copies = ()  # contiguous copies described for the step being made

    def update(self, grads, gradient):
        """Describes the ``.grad`` values ``grads`` (one per parameter)
        where they changed; ``gradient(p)`` is what a parameter with a
        ``.grad`` steps with (it made contiguous); the contiguous copies
        described go to ``copies``, to keep them alive during the step.
        Raises as describing every gradient would, and then nothing
        changes."""
        refs = self.refs
        freed = self.freed[0]
        if not freed and all(map(_is, map(_deref, refs), grads)):
            return
        n = len(grads)
        changed = None  # every entry
        if not freed:
            changed = list(compress(range(n), map(_is_not, map(_deref, refs), grads)))
            if len(changed) == n:
                changed = None
        if changed is None:
            subset, dtypes, numels = grads, self.dtypes, self.numel_list
        else:
            subset = list(map(grads.__getitem__, changed))
            dtypes = list(map(self.dtypes.__getitem__, changed))
            numels = list(map(self.numel_list.__getitem__, changed))
        pointers = self._plain_pointers(subset, dtypes, numels)
        if pointers is not None:
            new_refs = list(map(weakref.ref, subset, repeat(self.on_freed)))
            copies = ()
            where = slice(0, n) if changed is None else changed
            self.records["data"][where] = pointers
            self.records["numel"][where] = self.numels[where]
            self.records["dtype"][where] = self.codes[where]
        else:
            new_refs, copies = self._describe_each(subset, changed, gradient)
        if changed is None:
            self.refs = new_refs
            self.freed[0] = False
        else:
            for i, ref in zip(changed, new_refs):
                refs[i] = ref
        self.copies = copies

    @staticmethod
    def _plain_pointers(subset, dtypes, numels):
        """The data pointers of ``subset`` when every one is a plain dense
        contiguous tensor of its parameter's dtype and numel; else None."""
        try:
            if set(map(type, subset)) != {torch.Tensor} or \
                    not all(map(_is, map(_get_layout, subset), repeat(torch.strided))) or \
                    not all(map(_is, map(_get_dtype, subset), dtypes)) or \
                    not all(map(_eq, map(torch.Tensor.numel, subset), numels)) or \
                    not all(map(torch.Tensor.is_contiguous, subset)):
                return None
            return np.fromiter(map(torch.Tensor.data_ptr, subset), np.uintp, len(subset))
        except Exception:  # described one by one below, which raises as always
            return None

    def _describe_each(self, subset, changed, gradient):
        """Entry by entry, with the checks and errors of describing every
        gradient anew; writes only when all of them pass."""
        indices = range(len(subset)) if changed is None else changed
        params = self.params
        # sparse gradients raise here; None (no .grad) stays None
        tensors = [None if g is None else gradient(params[i]) for i, g in zip(indices, subset)]
        buffers = [_ABSENT if t is None else describe(t, writable=False, what=f"grads[{i}]")
                   for i, t in zip(indices, tensors)]
        new_refs = []
        for grad, tensor in zip(subset, tensors):
            if grad is None:
                new_refs.append(_NONE_REF)
            elif tensor is grad:
                new_refs.append(weakref.ref(grad, self.on_freed))
            else:
                new_refs.append(_NEVER_REF)  # a copy for this step
        records = self.records
        for i, buf in zip(indices, buffers):
            records[i] = (buf.address, buf.numel, buf.dtype, 0)
        copies = [t for g, t in zip(subset, tensors) if g is not None and t is not g]
        return new_refs, copies
