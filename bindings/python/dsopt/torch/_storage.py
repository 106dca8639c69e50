"""The parameters' storage as dsopt holds it, and how the parameters left
it: dsopt updates each parameter in place through the ``data_ptr()`` it
was given, so a parameter whose storage was replaced (``model.to(...)``,
``p.data = ...``) must be pointed at its new storage (or the optimizer
rebuilt, for another dtype or device) before dsopt touches it again.

``ParamStorage.moved()`` is the check made at every step: one
``data_ptr()`` per parameter, compared as a list (no Python loop).
``ParamStorage`` keeps the storage it describes referenced, so that no
other tensor can take a parameter's old address while dsopt has not seen
the change: the storage a moved parameter left stays allocated until the
optimizer follows it (the next step), and an unchanged address always
means the storage dsopt has, with its dtype. That also covers the
``.grad`` that ``model.to(...)`` moves along with the parameters (the
kept gradient descriptors are dropped when the parameters are followed)
and the device: CUDA memory and host memory share one address space
(unified addressing), so a tensor on another device has another
address."""

import operator

import torch

_data_ptr = torch.Tensor.data_ptr
_get_dtype = operator.attrgetter("dtype")
_get_data = operator.attrgetter("data")

# The dtypes dsopt updates (dsopt.tensors takes these).
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class ParamStorage:
    """The data pointer, dtype and device of every parameter as dsopt
    holds them (taken when the dsopt optimizer is made or rebound), and
    their storage, kept referenced."""

    def __init__(self, tensors, local=None):
        self.tensors = tensors
        # ``local(tensors)``: what dsopt updates for them (FSDP2's local
        # shards, read anew at each check); None: the tensors themselves.
        self._local = local
        current = self.current()
        self.kept = list(map(_get_data, current))  # tensors on the same storage
        self.pointers = list(map(_data_ptr, current))
        self.dtypes = list(map(_get_dtype, current))
        self.numels = list(map(torch.Tensor.numel, current))
        self.device = current[0].device if current else torch.device("cpu")

    def current(self):
        """What dsopt updates for the parameters now."""
        return self.tensors if self._local is None else self._local(self.tensors)

    def moved(self) -> bool:
        """Whether some parameter's storage differs from dsopt's."""
        return list(map(_data_ptr, self.current())) != self.pointers

    def dtype_changes(self):
        """The indices of the parameters whose dtype differs from dsopt's."""
        return [i for i, (p, dtype) in enumerate(zip(self.current(), self.dtypes))
                if p.dtype != dtype]

    def numel_changes(self):
        """The indices of the parameters whose numel differs from dsopt's."""
        return [i for i, (p, numel) in enumerate(zip(self.current(), self.numels))
                if p.numel() != numel]


def describe_param(p, i, param_groups) -> str:
    """``parameter i (param_groups[g], shape (...))``: the place of ``p``,
    an optimizer's parameter ``i``, among its ``param_groups``, for error
    messages."""
    start = 0
    for g, group in enumerate(param_groups):
        count = len(group["params"])
        if i < start + count:
            names = group.get("param_names")
            name = f" {names[i - start]!r}" if names and i - start < len(names) else ""
            return f"parameter {i}{name} (param_groups[{g}], shape {tuple(p.shape)})"
        start += count
    return f"parameter {i} (shape {tuple(p.shape)})"


def check_current(tensors, param_groups):
    """The device all parameters ``tensors`` (an optimizer's, in the order
    of its ``param_groups``) are on now; RuntimeError naming the first
    parameter dsopt cannot update where it is now (dtype, layout, mixed
    devices), before anything changes."""
    device = tensors[0].device
    for i, p in enumerate(tensors):
        what = None
        if p.dtype not in SUPPORTED_DTYPES:
            what = (f"is now {p.dtype}; dsopt updates float32, float16 and bfloat16 "
                    f"parameters: cast the model to one of them")
        elif p.layout != torch.strided or not p.is_contiguous():
            what = "is now not a dense contiguous tensor; dsopt updates parameters in place " \
                   "through their data pointer: give it contiguous storage"
        elif p.device != device:
            what = (f"is on {p.device}, parameter 0 on {device}: dsopt keeps one optimizer "
                    f"on one device; move the whole model to one device")
        elif p.device.type not in ("cpu", "cuda"):
            what = f"is now on {p.device}; dsopt runs on the CPU or on CUDA"
        if what is not None:
            raise RuntimeError(f"dsopt.torch: {describe_param(p, i, param_groups)} {what}. "
                               f"Nothing was updated; the optimizer follows the parameters "
                               f"again once they are.")
    return device
