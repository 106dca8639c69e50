"""FSDP2's parameter all-gather as bf16 or int8 codes of the exact shard
(docs/guides/fsdp2-compression.md "The all-gather").

FSDP2 hands over ``input`` (this rank's fp32 shard of the module's
parameters, n values, a view of ``output``'s row) and ``output`` (P rows
of n). Each rank encodes its shard, one all-gather moves the codes, and
every rank decodes every row, its own included, so the forward of every
rank sees the same decoded values while the sharded parameters the
optimizer updates stay exact. Bytes sent: ``(P-1) ceil(n/b) (4 + b)`` for
int8, ``(P-1) 2 n`` for bf16."""

import torch
import torch.distributed as dist

from ._collective import Counted, ring_bytes
from ._internals import AllGather, DefaultAllGather


class CompressedAllGather(Counted, AllGather):
    """The all-gather of one FSDP module. ``codec`` None: FSDP2's own,
    counted."""

    kind = "all-gather"

    def __init__(self, module_name, codec):
        super().__init__(module_name, codec)
        self._plain = DefaultAllGather()

    @staticmethod
    def _why_uncompressed(output, inp, world):
        if inp.dtype != torch.float32 or output.dtype != torch.float32:
            return (f"the parameters are gathered in {inp.dtype}; the codes encode float32 shards "
                    "(a MixedPrecisionPolicy param_dtype, or an all-gather extension)")
        if output.numel() != world * inp.numel():
            return f"an output of {output.numel()} elements for {world} inputs of {inp.numel()}"
        return None

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        world = group.size()
        reason = None if self.codec is None else self._why_uncompressed(output_tensor, input_tensor, world)
        if self.codec is None or world == 1 or reason:
            if reason:
                self._fall_back(reason)
            self.bytes_sent += ring_bytes(world, input_tensor.numel(), input_tensor.element_size())
            return self._plain(output_tensor=output_tensor, input_tensor=input_tensor, group=group,
                               async_op=async_op)
        n = input_tensor.numel()
        self._on_stream(input_tensor)
        size = self.codec.encoded_size(n)
        codes = torch.empty(world * size, dtype=torch.uint8, device=input_tensor.device)
        mine = codes[group.rank() * size:(group.rank() + 1) * size]
        self.codec.encode(input_tensor, out=mine)
        dist.all_gather_into_tensor(codes, mine, group=group)
        rows = output_tensor.view(world, n)
        for rank in range(world):
            self.codec.decode_sum(codes[rank * size:(rank + 1) * size], rows[rank])
        self.bytes_sent += (world - 1) * size
        return None
