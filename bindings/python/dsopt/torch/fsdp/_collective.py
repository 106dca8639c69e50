"""What the two collectives dsopt.torch.fsdp installs have in common: the
bytes they count, the uncompressed collective they fall back to, with a
warning, where FSDP2 hands them something the codes cannot serve, and the
stream their codec's work goes on."""

import warnings

import torch


class UncompressedWarning(UserWarning):
    """One of FSDP2's collectives ran uncompressed (FSDP2's own), for the
    reason the message gives; said once per module and reason. Nothing is
    lost: the gradients or parameters are exact, the residual is kept for
    the next compressed reduction."""


class Counted:
    """A collective of one FSDP module: ``bytes_sent`` (this rank, since it
    was installed) and ``uncompressed_calls`` (the calls that fell back)."""

    kind = ""  # "reduce-scatter" or "all-gather"

    def __init__(self, module_name, codec):
        self.module_name = module_name
        self.codec = codec  # None: FSDP2's collective, counted
        self.bytes_sent = 0
        self.uncompressed_calls = 0
        self._warned = set()

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def _fall_back(self, reason):
        self.uncompressed_calls += 1
        if reason not in self._warned:
            self._warned.add(reason)
            where = self.module_name or "the root module"
            warnings.warn(f"dsopt.torch.fsdp: the {self.kind} of {where} ran uncompressed: {reason}",
                          UncompressedWarning, stacklevel=3)

    def _on_stream(self, tensor):
        if tensor.is_cuda:
            with torch.cuda.device(tensor.device):
                self.codec.set_stream(torch.cuda.current_stream(tensor.device))


def ring_bytes(world, count, element_bytes):
    """Bytes one rank sends in a ring reduce-scatter of world * count
    elements, or a ring all-gather of count elements per rank."""
    return (world - 1) * count * element_bytes
