"""The GPT of gpt.py under PyTorch FSDP2, its collectives compressed with
dsopt's codes (dsopt.torch.fsdp, docs/guides/fsdp2-compression.md).

Every transformer block and the whole model are ``fully_shard``ed;
``dsopt.torch.fsdp.compress`` makes the gradient reduce-scatter int4 codes
with error feedback and the parameter all-gather int8 codes (or what
``--gradients`` / ``--parameters`` say; ``none`` keeps FSDP2's own), and
dsopt.torch.AdamW (``--optimizer torch``: torch.optim.AdamW) trains the
sharded parameters (docs/guides/fsdp2.md). Each rank takes its rows
of every global batch; rank 0 prints the loss, the bytes each rank sent in
FSDP2's collectives and the validation loss at the end.

    python3 examples/python/fsdp2_compressed_train.py --ranks 4            # starts 4 processes (gloo, CPU)
    python3 examples/python/fsdp2_compressed_train.py --ranks 2 --gradients sign --parameters bf16
    torchrun --nproc_per_node 4 examples/python/fsdp2_compressed_train.py  # or the variables torchrun sets

Needs torch with FSDP2 (torch.distributed.fsdp.fully_shard, torch >= 2.6)
and the corpus files gpt.py names. bench/fsdp2_compressed.py and
tests/python/test_fsdp_codes.py use the functions below."""

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "bindings" / "python"))

import gpt  # noqa: E402


def sharded_gpt(config, seed, mesh=None):
    """The GPT of ``config`` with ``seed``'s weights, every block and the
    model ``fully_shard``ed (on ``mesh``, default: all ranks)."""
    from torch.distributed.fsdp import fully_shard
    model = gpt.build_model(config, seed)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def rank_rows(batch, rank, world):
    """This rank's rows of a global batch (inputs, targets)."""
    rows = batch[0].shape[0] // world
    return tuple(t[rank * rows:(rank + 1) * rows] for t in batch)


def train_steps(model, opt, codes, corpus, steps, *, batch, seed, first=0):
    """``steps`` steps from step ``first``: (the global batch's loss, the
    bytes this rank sent in FSDP2's collectives) per step."""
    import torch.distributed as dist
    rank, world = dist.get_rank(), dist.get_world_size()
    losses, sent = [], []
    for step in range(first, first + steps):
        x, y = rank_rows(gpt.train_batch(corpus, step, batch, model.config.context, seed), rank, world)
        before = codes.bytes_sent
        opt.zero_grad()
        loss = model.loss(x, y)
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)  # the mean over the ranks: the global batch's loss
        losses.append(float(total) / world)
        sent.append(codes.bytes_sent - before)
    return losses, sent


def codec_arg(value):
    return None if value == "none" else value


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=0, help="start this many processes here (gloo)")
    p.add_argument("--gradients", default="int4", choices=["int8", "int4", "sign", "none"])
    p.add_argument("--parameters", default="int8", choices=["bf16", "int8", "none"])
    p.add_argument("--config", default="small", choices=sorted(gpt.CONFIGS))
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=32, help="sequences per global batch")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--optimizer", default="dsopt", choices=["dsopt", "torch"], help="whose AdamW")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--corpus", default="licenses", choices=sorted(gpt.CORPUS_FILES))
    return p.parse_args(argv)


def launch(script, ranks, args):
    """Runs ``script args`` on ``ranks`` processes that find each other as
    torchrun's do, one torch thread each; returns when all have ended
    (SystemExit with the first failure's code)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(ranks),
               OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(script), *args],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r))) for r in range(ranks)]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(next(c for c in codes if c))


def main(argv=None):
    args = parse_args(argv)
    if args.ranks and "RANK" not in os.environ:
        launch(Path(__file__), args.ranks, argv if argv is not None else sys.argv[1:])
        return
    import torch
    import torch.distributed as dist
    import dsopt.torch
    import dsopt.torch.fsdp

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    corpus = gpt.load_corpus(args.corpus)
    model = sharded_gpt(args.config, args.seed)
    codes = dsopt.torch.fsdp.compress(model, gradients=codec_arg(args.gradients),
                                      parameters=codec_arg(args.parameters))
    adamw = dsopt.torch.AdamW if args.optimizer == "dsopt" else torch.optim.AdamW
    opt = adamw(model.parameters(), lr=args.lr, weight_decay=0.01)
    start = time.perf_counter()
    losses, sent = train_steps(model, opt, codes, corpus, args.steps, batch=args.batch, seed=args.seed)
    seconds = (time.perf_counter() - start) / args.steps
    validation = gpt.validation_loss(model, corpus, model.config.context)
    if hasattr(opt, "close"):
        opt.close()   # before the process group goes
    if rank == 0:
        for step in range(0, args.steps, max(1, args.steps // 10)):
            print(f"step {step:4d}  loss {losses[step]:.4f}")
        print(f"{world} ranks, gradients {args.gradients}, parameters {args.parameters}: "
              f"final loss {losses[-1]:.4f}, validation loss {validation:.4f}, "
              f"{sent[-1]:,} bytes per step per rank, residuals {codes.residual_bytes:,} bytes, "
              f"{seconds:.3f} s per step")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
