"""dsopt.torch.fsdp: dsopt's codes as FSDP2's collectives.

    from torch.distributed.fsdp import fully_shard
    import dsopt.torch.fsdp

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    codes = dsopt.torch.fsdp.compress(model, gradients="int4", parameters="int8")
    ...train with any optimizer...
    codes.bytes_sent                       # this rank's bytes in FSDP2's collectives
    dcp.save({"model": ..., "optim": ..., "codes": codes}, checkpoint_id=...)   # residuals included

The gradient reduce-scatter travels as int8, int4 or sign codes with a
scale per block and error feedback (a residual per module, kept here, in
the checkpoint), summed in rank order; the parameter all-gather as bf16
or int8 codes of the exact fp32 shard (the forward sees the decoded
values, the optimizer updates the exact shard). The codes are compressed
ZeRO's, through the library (``dsopt.Codec``). Needs torch's FSDP2
(torch >= 2.6; written against 2.15). docs/guides/fsdp2-compression.md.
"""

from ._collective import UncompressedWarning
from ._compress import GRADIENT_CODECS, PARAMETER_CODECS, Compression, compress

__all__ = ["Compression", "GRADIENT_CODECS", "PARAMETER_CODECS", "UncompressedWarning", "compress"]
