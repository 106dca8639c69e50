#!/usr/bin/env python3
"""ZeRO-2's parameter allgather behind the next forward on a real model:
data-parallel training of the GPT of ``examples/python/gpt.py`` with
``dsopt.torch.AdamW`` under ZeRO stage 2 over mpi4py's COMM_WORLD, once
with ``overlap=True`` (gradients handed over during backward, the
allgather deferred and waited for module by module in the next forward)
and once with ``overlap=False`` (every gradient at ``step()``, the
allgather inside it), from the same initial weights on the same batches.

    mpirun -np 4 python3 bench/prefetch_gpt.py [--steps N] [--blocks B] ...

(run it on the emulated 1 Gbit/s link with
``DSOPT_NETEM_NP=4 bench/netem.sh python3 bench/prefetch_gpt.py``).

The two modes train in alternating blocks of N / B steps (overlap=False
first), each mode continuing its own run; a block is timed between two
barriers of all ranks and ends with every gather waited for
(``opt.wait_gathers()``), so a block's time is the whole of its steps:
batch, forward, backward and ``optimizer.step()``. Reported: the seconds
per step of each block (median and min-max over the blocks), rank 0's
median forward (the gathers' waits included), backward (the gradients'
hand-over included) and ``step()`` times, their ratio
(overlap=True over overlap=False), the bytes each rank sent per step and
the check that both modes' losses (every rank's, every step) and final
parameters are bit-identical. ``reduce_bucket_size`` (--reduce-bucket,
2^20) and ``allgather_bucket_size`` (--gather-bucket) are the same in
both modes. lr 1e-3, weight decay 0.01 (the class's default), no schedule; one torch thread per rank; rank r takes rows
r B/P .. (r+1) B/P - 1 of each global batch.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "python"))
import gpt  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=40, help="steps per mode (default 40)")
    p.add_argument("--blocks", type=int, default=4, help="alternating blocks per mode (default 4)")
    p.add_argument("--batch", type=int, default=32, help="sequences per global batch (default 32)")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--width", type=int, default=384)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--reduce-bucket", type=int, default=1 << 20,
                   help="reduce_bucket_size in elements, both modes (default 2^20; dsopt's own "
                        "default, one bucket, leaves nothing to reduce during backward)")
    p.add_argument("--gather-bucket", type=int, default=0,
                   help="allgather_bucket_size in elements, both modes (default: dsopt.torch's "
                        "choice for overlap=True, 2^22)")
    p.add_argument("--corpus", default="licenses", choices=sorted(gpt.CORPUS_FILES))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.steps % args.blocks:
        p.error("--steps must be a multiple of --blocks")
    return args


class Run:
    """One mode's model, optimizer and record."""

    def __init__(self, overlap, args, config, world):
        import dsopt.torch
        self.overlap = overlap
        self.model = gpt.build_model(config, args.seed)
        zero = {"stage": 2, "reduce_bucket_size": args.reduce_bucket}
        if args.gather_bucket:
            zero["allgather_bucket_size"] = args.gather_bucket
        # a communicator of its own: the deferred gathers of one mode never
        # wait on the other's calls
        self.comm = world.Dup()
        self.opt = dsopt.torch.AdamW(self.model.parameters(), lr=1e-3, comm=self.comm,
                                     zero_optimization=zero, overlap=overlap)
        self.losses, self.block_seconds, self.bytes = [], [], []
        self.parts = {"forward": [], "backward": [], "step": []}  # this rank's seconds per step
        self.step = 0

    def block(self, steps, args, config, corpus, world):
        rank, size = world.Get_rank(), world.Get_size()
        local = args.batch // size
        world.Barrier()
        start = time.perf_counter()
        for _ in range(steps):
            x, y = gpt.train_batch(corpus, self.step, args.batch, config.context, args.seed)
            self.opt.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            loss = self.model.loss(x[rank * local:(rank + 1) * local], y[rank * local:(rank + 1) * local])
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            self.opt.step()
            t3 = time.perf_counter()
            for part, seconds in zip(self.parts, (t1 - t0, t2 - t1, t3 - t2)):
                self.parts[part].append(seconds)
            self.losses.append(loss.item())
            self.bytes.append(self.opt.last_step_info.bytes_sent)
            self.step += 1
        self.opt.wait_gathers()
        world.Barrier()
        self.block_seconds.append((time.perf_counter() - start) / steps)

    def close(self):
        self.opt.close()
        self.comm.Free()


def main():
    args = parse_args()
    import torch
    from mpi4py import MPI

    torch.set_num_threads(1)
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    if args.batch % size:
        raise SystemExit(f"prefetch_gpt: --batch {args.batch} is not a multiple of {size} ranks")
    config = gpt.GPTConfig(context=args.context, width=args.width, depth=args.depth, heads=args.heads)
    corpus = gpt.load_corpus(args.corpus)
    runs = [Run(False, args, config, world), Run(True, args, config, world)]
    params = sum(p.numel() for p in runs[0].model.parameters())
    buckets = runs[1].opt.dsopt.gather_buckets
    if rank == 0:
        print(f"prefetch_gpt: GPT {config}, {params:,} parameters, {size} ranks, global batch "
              f"{args.batch}, {args.steps} steps per mode in {args.blocks} alternating blocks, "
              f"ZeRO-2 AdamW, reduce_bucket_size {args.reduce_bucket}, torch {torch.__version__}; "
              f"overlap=True gathers {buckets} buckets",
              flush=True)
    per_block = args.steps // args.blocks
    for _ in range(args.blocks):
        for run in runs:
            run.block(per_block, args, config, corpus, world)
    same_losses = runs[0].losses == runs[1].losses
    same_params = all(torch.equal(a, b) for a, b in zip(runs[0].model.parameters(),
                                                        runs[1].model.parameters()))
    ok = world.allreduce(int(same_losses and same_params), op=MPI.MIN)
    if rank == 0:
        for run in runs:
            s = run.block_seconds
            print(f"overlap={run.overlap!s:5}: {1e3 * statistics.median(s):7.1f} ms/step "
                  f"({1e3 * min(s):.1f}-{1e3 * max(s):.1f} over {len(s)} blocks), "
                  f"bytes_sent/step {statistics.median(run.bytes):,.0f}, "
                  f"final loss (rank 0) {run.losses[-1]:.6f}")
            print("  rank 0's median ms per step: " + ", ".join(
                f"{part} {1e3 * statistics.median(v):.0f}" for part, v in run.parts.items()))
        ratio = statistics.median(runs[1].block_seconds) / statistics.median(runs[0].block_seconds)
        ratios = [b / a for a, b in zip(runs[0].block_seconds, runs[1].block_seconds)]
        print(f"step time overlap=True / overlap=False: {ratio:.2f} "
              f"(per block pair {min(ratios):.2f}-{max(ratios):.2f})")
        print(f"losses and final parameters bit-identical on every rank: {'yes' if ok else 'NO'}")
    for run in runs:
        run.close()
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
