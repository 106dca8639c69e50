"""Bytes on the wire of dsopt.torch optimizers inside DistributedDataParallel
at 2 gloo ranks on this machine: dsopt alone, DDP with
dsopt.torch.ddp_comm_hook, and DDP with its own allreduce, for AdamW, AdamW
under ZeRO-2, 1-bit Adam, 1-bit LAMB and 0/1 Adam (freeze steps at 3), on a
64-48-10 classifier (3,610 parameters) over scikit-learn's digits. Per rank
and step, averaged over the run: dsopt's own count (StepInfo.bytes_sent) and
what the process wrote to its sockets (/proc/self/io wchar, gloo's framing
and DDP's traffic included). Runs tests/python/ddp_hook_worker.py.

    DSOPT_LIBRARY_DIR=build python bench/ddp_bytes.py [steps, default 60]"""

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests" / "python"


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = dict(os.environ, OMP_NUM_THREADS="1", DSOPT_DDP_STEPS=str(steps), WORLD_SIZE="2",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
               PYTHONPATH=os.pathsep.join([str(REPO / "bindings" / "python"), str(TESTS)]))
    with tempfile.TemporaryDirectory() as out:
        procs = [subprocess.Popen([sys.executable, str(TESTS / "ddp_hook_worker.py"), out],
                                  env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)))
                 for rank in range(2)]
        if any(p.wait() for p in procs):
            sys.exit("ddp_bytes: a rank failed")
        ranks = [json.loads(Path(f"{out}/rank{r}.json").read_text()) for r in range(2)]
    spread = max(abs(a[m]["wrote"] - b[m]["wrote"]) / a[m]["wrote"]
                 for a, b in zip(ranks[0].values(), ranks[1].values()) for m in a)
    print(f"bytes per step and rank, 2 gloo ranks, {steps} steps: rank 0's (rank 1's socket "
          f"bytes differ by at most {100 * spread:.1f}%)")
    print("| optimizer | dsopt alone: dsopt / socket | DDP + ddp_comm_hook: dsopt / socket "
          "| DDP allreduce: dsopt / socket |")
    print("| --- | ---: | ---: | ---: |")
    for name, modes in ranks[0].items():
        cells = [f"{sum(modes[m]['bytes_sent']) / steps:,.0f} / {modes[m]['wrote'] / steps:,.0f}"
                 for m in ("alone", "hook", "ddp")]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
