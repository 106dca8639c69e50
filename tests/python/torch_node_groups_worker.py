"""The gloo ranks of test_torch_node_groups.py (torch.multiprocessing, 4
processes as 2 nodes of 2 declared by "ranks_per_node"):

* ``reference``: 1-bit Adam, 1-bit LAMB and 0/1 Adam (the first scenario
  of each in mpi_node_aware_onebit.py) through ``dsopt.Optimizer`` on
  ``Communicator.from_torch()`` given its node and rail groups
  (``Communicator.set_nodes`` of groups made by dsopt.torch's
  ``node_groups``); parameters and blob to ``<opt>-rank<r>.npz`` for the
  comparison with the node-aware numpy reference;
* ``torch``: ``dsopt.torch.Optimizer`` with "hierarchy" "node_aware" and
  "flat" on the default group: whether it made the node groups, and every
  step's bytes (all, to other nodes) and parameters to
  ``torch-<hierarchy>-rank<r>.npz``.
"""

import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
for path in (HERE.parent.parent / "bindings" / "python", HERE):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import dsopt  # noqa: E402
import dsopt.torch  # noqa: E402
from dsopt.torch._communicator import node_groups, node_of_ranks  # noqa: E402

R = 2
STEPS = 10


def init(rank, world, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)


def reference_main(rank, world, port, out):
    import onebit_runs
    from mpi_node_aware_onebit import OPTIMIZERS, run, save_npz, with_topology

    init(rank, world, port)
    try:
        comm = dsopt.Communicator.from_torch()
        node_pg, rail_pg = node_groups(dist, node_of_ranks(dist, R))
        comm.set_nodes(dsopt.Communicator.from_torch(node_pg), dsopt.Communicator.from_torch(rail_pg),
                       close_with=True)
        for opt, (runs, grads_for, names, _) in OPTIMIZERS.items():
            sc = with_topology(runs.BY_NAME[names[0]], "node_aware", R)
            params, infos, blob, _ = run(sc, grads_for, comm, rank, world)
            save_npz(str(Path(out) / f"{opt}-rank{rank}.npz"), params, infos, blob=blob)
        comm.close()
        # The node group as rail group too: the sizes fit (2 x 2), the
        # members do not; every rank refuses the optimizer.
        swapped = dsopt.Communicator.from_torch()
        swapped.set_nodes(dsopt.Communicator.from_torch(node_pg), dsopt.Communicator.from_torch(node_pg),
                          close_with=True)
        config = {"optimizer": {"type": "OneBitAdam"}, "topology": {"hierarchy": "node_aware"}}
        try:
            dsopt.Optimizer(config, [np.zeros(10, np.float32)], comm=swapped).close()
            result = "created"
        except dsopt.InvalidArgument as e:
            result = "refused" if "dsopt_comm_set_nodes" in str(e) else str(e)
        swapped.close()
        (Path(out) / f"swapped-rank{rank}.txt").write_text(result)
        assert onebit_runs is not None
    finally:
        dist.destroy_process_group()


def torch_main(rank, world, port, out):
    init(rank, world, port)
    try:
        for hierarchy in ("node_aware", "flat"):
            torch.manual_seed(0)
            params = [torch.nn.Parameter(torch.randn(n)) for n in (1000, 37, 4097)]
            config = {"optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-2, "freeze_step": 3}},
                      "threads": 1, "topology": {"hierarchy": hierarchy, "ranks_per_node": R}}
            opt = dsopt.torch.Optimizer(params, config)
            made = opt._comm.nodes is not None
            rows, snapshots = [], []
            for k in range(STEPS):
                gen = torch.Generator().manual_seed(1000 * k + rank)
                for p in params:
                    p.grad = torch.randn(p.numel(), generator=gen)
                opt.step()
                i = opt.last_step_info
                rows.append([i.compressed, i.bytes_sent, i.bytes_inter_node])
                snapshots.append(torch.cat([p.detach().flatten() for p in params]).numpy().copy())
            opt.close()
            np.savez(Path(out) / f"torch-{hierarchy}-rank{rank}.npz", rows=np.array(rows, np.int64),
                     params=np.stack(snapshots), made=np.array(made))
    finally:
        dist.destroy_process_group()
