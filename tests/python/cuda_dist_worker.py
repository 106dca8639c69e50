"""One rank of test_cuda_torch_dist.py: every configuration of
cuda_lockstep.CONFIGS (fp32 and bf16 parameters) run in lockstep on the
CPU and on the GPU with this rank's part of each batch, over

* ``gloo``: torch.distributed's gloo (RANK, WORLD_SIZE, MASTER_ADDR and
  MASTER_PORT set, as torchrun sets them; every rank on the current GPU),
  the optimizers' default communicator (``Communicator.from_torch()``);
* ``nccl``: torch.distributed's NCCL, one GPU per rank (LOCAL_RANK's);
* ``mpi``: mpi4py's COMM_WORLD under mpirun (every rank on the current GPU).

First the torch communicator's collectives on this device's buffers,
wrapped as dsopt's callbacks wrap them, against the expected values (gloo
and nccl). Writes OUT_DIR/<backend>-rank<r>.json: the collectives'
problems, and per run the error (the first step where the CPU and the GPU
differed) or the losses and the final parameters' bits.

    cuda_dist_worker.py gloo|nccl|mpi OUT_DIR"""

import hashlib
import json
import os
import sys
import traceback
from pathlib import Path

import torch


def main(backend, out_dir):
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    import cuda_lockstep as ls  # DEVICE is the current device: import after set_device

    report = {"device": str(ls.DEVICE)}
    if backend == "mpi":
        from mpi4py import MPI

        world = MPI.COMM_WORLD
        rank, size, comms = world.Get_rank(), world.Get_size(), (world, world)
    else:
        torch.distributed.init_process_group(backend)
        dist = torch.distributed
        rank, size, comms = dist.get_rank(), dist.get_world_size(), (None, None)
        from torch_comm_worker import check_collectives

        problems, fallbacks = check_collectives(dist.group.WORLD, rank, size, ls.DEVICE)
        report["collectives"] = {"problems": problems, "fallbacks": fallbacks}
    path = Path(out_dir) / f"{backend}-rank{rank}.json"
    runs = report["runs"] = {}
    # every config, then overlap=True under ZeRO (the parameter allgather
    # deferred behind the next forward where the communicator allows it)
    keys = [(f"{name}.{d}", name, d, False) for name in ls.CONFIGS for d in ls.DTYPES]
    keys += [(f"{name}.{d}.prefetch", name, d, True) for name in ls.ZERO_CONFIGS for d in ls.DTYPES]
    for key, name, dtype_name, overlap in keys:
        try:
            run = ls.run_lockstep(name, ls.DEVICE, ls.DTYPES[dtype_name], world=size, rank=rank,
                                  comms=comms, overlap=overlap)
            runs[key] = {"mismatch": run["mismatch"], "losses": run["losses"],
                         "compressed": run["compressed"],
                         "params": hashlib.sha256(run["params"].tobytes()).hexdigest()}
        except Exception:  # noqa: BLE001 - reported; the ranks go on together
            runs[key] = {"error": traceback.format_exc(limit=4)}
        path.write_text(json.dumps(report))
    report["finished"] = True
    path.write_text(json.dumps(report))
    if backend != "mpi":
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("gloo", "nccl", "mpi"):
        sys.exit("usage: cuda_dist_worker.py gloo|nccl|mpi OUT_DIR")
    main(*sys.argv[1:])
