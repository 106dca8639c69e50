"""The small GPT of examples/python/gpt.py trained under PyTorch's FSDP2
(``torch.distributed.fsdp.fully_shard``) with a dsopt.torch optimizer on
the sharded parameters (docs/guides/fsdp2.md).

    python3 examples/python/fsdp2_train.py --procs 4            # FSDP2, dsopt AdamW
    python3 examples/python/fsdp2_train.py --procs 4 --hsdp 2   # HSDP 2 x 2, 1-bit Adam
    python3 examples/python/fsdp2_train.py --procs 2 --until 100 --save ckpt
    python3 examples/python/fsdp2_train.py --procs 4 --load ckpt               # 2 -> 4

``--procs N`` starts N processes here (torch.multiprocessing, no torchrun);
without it the process reads torchrun's variables (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), so torchrun or one command per rank works too.
Every transformer block and the root are ``fully_shard``ed, each rank
holding its rows of every tensor; ``dsopt.torch.AdamW(model.parameters())``
updates the local shards. With ``--hsdp R`` the ranks form a (R replicas,
N/R shards) mesh, the model is sharded over the shard dimension only, and
``dsopt.torch.OneBitAdam`` averages (then, after ``--freeze-step`` steps,
exchanges its compressed momentum) across the replicas. ``--save`` and
``--load`` go through torch.distributed.checkpoint, to any world size.
The backend is NCCL with a GPU per rank when CUDA is available, else gloo.
Rank 0 prints the training loss, the validation loss and the optimizer
state's bytes on this rank.
"""

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "bindings" / "python"))
sys.path.insert(0, str(HERE))
import dsopt.torch  # noqa: E402
import gpt  # noqa: E402
import local_ranks  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", type=int, default=0, metavar="N",
                        help="start N processes here (default: read torchrun's variables)")
    parser.add_argument("--hsdp", type=int, default=0, metavar="R",
                        help="HSDP with R replicas and 1-bit Adam across them")
    parser.add_argument("--model", choices=sorted(gpt.CONFIGS), default="small")
    parser.add_argument("--corpus", choices=sorted(gpt.CORPUS_FILES), default="licenses")
    parser.add_argument("--steps", type=int, default=200, help="steps of the run (its schedule)")
    parser.add_argument("--until", type=int, default=0, metavar="K",
                        help="stop after step K of the run (then --save)")
    parser.add_argument("--batch", type=int, default=16, help="global batch (sequences)")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--freeze-step", type=int, default=40, help="1-bit Adam's warmup steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", metavar="DIR", help="save model and optimizer at the end (DCP)")
    parser.add_argument("--load", metavar="DIR", help="resume from a --save (any world size)")
    parser.add_argument("--log-every", type=int, default=25)
    return parser.parse_args(argv)


def shard(model, mesh):
    """FSDP2 over ``mesh``: each block, then the root (embeddings, final
    LayerNorm and head)."""
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def setup(args, device):
    """(model, optimizer, scheduler, rows of each global batch this rank
    takes): the GPT on ``device``, sharded, with its optimizer."""
    from torch.distributed.device_mesh import init_device_mesh

    world, rank = dist.get_world_size(), dist.get_rank()
    model = gpt.build_model(args.model, args.seed).to(device)
    if args.hsdp:
        if world % args.hsdp:
            raise SystemExit(f"--hsdp {args.hsdp} does not divide {world} processes")
        mesh = init_device_mesh(device.type, (args.hsdp, world // args.hsdp),
                                mesh_dim_names=("replicate", "shard"))
        shard(model, mesh["shard"])
        # the replicas come from the mesh: dsopt averages (then exchanges
        # the compressed momentum) across them; FSDP2 reduce-scatters within
        # each replica's shard group only
        opt = dsopt.torch.OneBitAdam(model.parameters(), lr=args.lr, freeze_step=args.freeze_step)
    else:
        shard(model, init_device_mesh(device.type, (world,)))
        opt = dsopt.torch.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, gpt.warmup_cosine(args.steps))
    per_rank = args.batch // world
    return model, opt, sched, slice(rank * per_rank, (rank + 1) * per_rank)


def checkpoint(model, opt, sched, path, load):
    """Saves or loads the model, the optimizer (DTensor state, resharded to
    this world size) and the schedule's step through torch.distributed.checkpoint."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict, get_optimizer_state_dict, set_model_state_dict,
        set_optimizer_state_dict)

    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt),
             "sched": sched.state_dict()}
    if not load:
        dcp.save(state, checkpoint_id=path)
        return
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, opt, state["optim"])
    sched.load_state_dict(state["sched"])


def train(args):
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", os.environ["RANK"])) % torch.cuda.device_count())
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    corpus = gpt.load_corpus(args.corpus)
    context = gpt.CONFIGS[args.model].context
    model, opt, sched, rows = setup(args, device)
    first = 0
    if args.load:
        checkpoint(model, opt, sched, args.load, load=True)
        first = sched.last_epoch
    if rank == 0:
        kind = f"HSDP {args.hsdp} x {world // args.hsdp}, 1-bit Adam" if args.hsdp else \
            f"FSDP2 over {world}, AdamW"
        print(f"{args.model} GPT, {sum(p.numel() for p in model.parameters()):,} parameters; "
              f"{kind}; {backend}; steps {first}..{min(args.until or args.steps, args.steps)} of "
              f"{args.steps}", flush=True)
    started = time.monotonic()
    last = min(args.until or args.steps, args.steps)
    for step in range(first, last):
        x, y = gpt.train_batch(corpus, step, args.batch, context, args.seed)
        opt.zero_grad()
        loss = model.loss(x[rows].to(device), y[rows].to(device))
        loss.backward()
        opt.step()
        sched.step()
        if (step + 1) % args.log_every == 0 or step + 1 == last:
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            val = gpt.validation_loss(model, corpus, context)
            if rank == 0:
                info = opt.last_step_info
                print(f"step {step + 1}: loss {float(mean) / world:.4f}  validation {val:.4f}  "
                      f"({'compressed' if info.compressed else 'full'}, {info.bytes_sent} B sent)",
                      flush=True)
    memory = opt.memory_usage()
    if rank == 0:
        print(f"{time.monotonic() - started:.1f} s; optimizer state on rank 0: "
              f"{memory['host'] + memory['device']:,} bytes", flush=True)
    if args.save:
        checkpoint(model, opt, sched, args.save, load=False)
    opt.close()
    dist.destroy_process_group()


def main(argv=None):
    args = parse_args(argv)
    if args.procs:
        local_ranks.spawn(train, args.procs, args)
    else:
        train(args)


if __name__ == "__main__":
    main()
