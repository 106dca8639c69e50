"""FSDP2's gradient reduce-scatter as dsopt's int8 / int4 / sign codes
with error feedback (docs/guides/fsdp2-compression.md "The reduce-scatter").

FSDP2 hands over ``input`` (P pieces of m fp32 values, piece r for rank r)
and ``output`` (m values). Each rank encodes its P pieces with its
residual (``x = fl(g + e)``; the residual becomes the int8 code of what the
encoding lost), one all-to-all gives every rank its piece from every rank,
and the decoded pieces are summed in rank order (0, 1, ..., P-1), then
divided by P for an average: every rank gets the same bits whatever moved
the codes. Bytes sent: ``(P-1) ceil(m/b) (4 + b c/8)``."""

import torch
import torch.distributed as dist

from ._collective import Counted, ring_bytes
from ._internals import DefaultReduceScatter, ReduceScatter


def _op_kind(op):
    """"sum", "avg" or None (another reduction: PREMUL_SUM, MAX, ...)."""
    for kind, known in (("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG)):
        try:
            if op == known:
                return kind
        except TypeError:
            return None
    return None


class CompressedReduceScatter(Counted, ReduceScatter):
    """The reduce-scatter of one FSDP module. ``codec`` None: FSDP2's own,
    counted. ``residual``: this rank's residual (P runs of m values' int8
    codes, on the module's device), None without error feedback."""

    kind = "reduce-scatter"

    def __init__(self, module_name, codec, shard_numel, residual):
        super().__init__(module_name, codec)
        self.shard_numel = shard_numel
        self.residual = residual
        self._plain = DefaultReduceScatter()

    def _why_uncompressed(self, output, inp, world, op):
        if inp.dtype != torch.float32 or output.dtype != torch.float32:
            return (f"the gradients are reduced in {inp.dtype}; the codes take float32 "
                    "(MixedPrecisionPolicy(reduce_dtype=torch.float32))")
        if _op_kind(op) is None:
            return (f"the reduction is {op}, not a sum or an average "
                    "(set_gradient_divide_factor asks for a scaled sum)")
        if inp.numel() != world * self.shard_numel or output.numel() != self.shard_numel:
            return (f"{inp.numel() // world} of the module's {self.shard_numel} gradient elements "
                    "per rank arrived (parameters without a gradient in this backward; "
                    "FSDPModule.set_reduce_scatter_unused_params(True) sends zeros for them)")
        return None

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        world = group.size()
        reason = None if self.codec is None else self._why_uncompressed(output_tensor, input_tensor,
                                                                        world, op)
        if self.codec is None or world == 1 or reason:
            if reason:
                self._fall_back(reason)
            self.bytes_sent += ring_bytes(world, output_tensor.numel(), output_tensor.element_size())
            return self._plain(output_tensor=output_tensor, input_tensor=input_tensor, group=group,
                               op=op, async_op=async_op)
        self._on_stream(input_tensor)
        send = self.codec.encode(input_tensor, runs=world, residual=self.residual)
        received = torch.empty_like(send)
        dist.all_to_all_single(received, send, group=group)
        self.codec.decode_sum(received, output_tensor, runs=world)
        if _op_kind(op) == "avg":
            output_tensor.div_(world)
        self.bytes_sent += (world - 1) * (send.numel() // world)
        return None
