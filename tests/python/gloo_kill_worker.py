"""One rank of a torch.distributed gloo run (``python gloo_kill_worker.py
RANK WORLD PORT TIMEOUT_S STAGE WHERE SIGNAL OUT_DIR``; TIMEOUT_S 0 keeps
torch's default of 30 minutes): dsopt AdamW over ``Communicator.from_torch``.
Rank 1 sends itself SIGNAL (KILL: it dies; STOP: it hangs, alive, until the
test kills it) inside its step 5, on entering the step's first or last
torch collective (WHERE: "first" or "last"; a step makes as many as step 4
did). Every rank writes
``rank<R>.json``: rank 1 the wall-clock time of the kill; a survivor the time
it returned from the failed step, the error, and whether its state stayed as
before the step ("atomic") or the optimizer is marked failed ("failed")."""

import datetime
import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

import dsopt

KILL_STEP = 5


class CollectiveCounter:
    """Counts this process's torch collectives (dsopt's from_torch calls
    dist.all_reduce and dist.all_gather) and runs `on_call(n)` before each."""

    def __init__(self):
        self.calls = 0
        self.on_call = lambda n: None
        for name in ("all_reduce", "all_gather"):
            setattr(dist, name, self._wrap(getattr(dist, name)))

    def _wrap(self, fn):
        def call(*args, **kwargs):
            self.calls += 1
            self.on_call(self.calls)
            return fn(*args, **kwargs)
        return call


def main(rank, world, port, timeout_s, stage, where, sig, out_dir):
    torch.set_num_threads(1)
    kwargs = {"timeout": datetime.timedelta(seconds=timeout_s)} if timeout_s > 0 else {}
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, **kwargs)
    out = Path(out_dir) / f"rank{rank}.json"
    config = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "threads": 1,
              "zero_optimization": {"stage": stage}}
    params = [np.linspace(-1, 1, 400003, dtype=np.float32), np.ones(17, np.float32)]
    rng = np.random.default_rng(rank)
    comm = dsopt.Communicator.from_torch(None)
    opt = dsopt.Optimizer(config, params, comm=comm)
    counter = CollectiveCounter()
    per_step = 0
    for step in range(50):
        grads = [rng.standard_normal(p.size).astype(np.float32) for p in params]
        blob = opt.state_dict()
        before = counter.calls
        if rank == 1 and step == KILL_STEP:
            target = before + (1 if where == "first" else per_step)

            def kill(n, target=target):
                if n == target:
                    out.write_text(json.dumps({"killed_at": time.time(), "collective": n - before,
                                               "of": per_step}))
                    os.kill(os.getpid(), getattr(signal, "SIG" + sig))
            counter.on_call = kill
        try:
            opt.step(grads)
        except dsopt.DsoptError as error:
            returned = time.time()
            try:
                state = "atomic" if opt.state_dict() == blob else "changed"
            except dsopt.CommError as mark:
                state = "failed" if "state is inconsistent" in str(mark) else f"other: {mark}"
            out.write_text(json.dumps({"returned_at": returned, "step": step, "state": state,
                                       "error": f"{type(error).__name__}: {error}"}))
            os._exit(0)  # torch's process group would wait for the dead rank at exit
        per_step = counter.calls - before
    out.write_text(json.dumps({"finished": True}))
    os._exit(0)


if __name__ == "__main__":
    main(*map(int, sys.argv[1:6]), *sys.argv[6:9])
