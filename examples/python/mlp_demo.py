"""dsopt's main demo: data-parallel training of an MLP classifier with Adam
and with 1-bit Adam on every rank of MPI_COMM_WORLD (or one process).

Each rank computes the gradient of its share of every batch (plain numpy);
dsopt averages (Adam, and 1-bit Adam's warmup) or compresses (1-bit Adam
after warmup) and updates the parameters in place. Rank 0 prints the loss,
the stage and the bytes sent per step, a summary table, and writes a plot
and a JSON summary.

    mpirun -np 4 python3 mlp_demo.py --out out/demo
    python3 mlp_demo.py --steps 100          # one process
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bindings", "python"))
import dsopt  # noqa: E402

try:
    from mpi4py import MPI
except ImportError:  # one process with the local communicator
    MPI = None

FEATURES, CLASSES, HIDDEN = 32, 10, 256


# ---- data: a fixed, non-linearly separable classification problem ----------

def make_data(n, seed):
    """Labels come from a random 2-layer teacher network; inputs are
    correlated Gaussians. The same seed gives every rank the same data."""
    rng = np.random.default_rng(seed)
    mixing = rng.standard_normal((FEATURES, FEATURES)) / np.sqrt(FEATURES)
    teacher1 = rng.standard_normal((FEATURES, 64)) / np.sqrt(FEATURES)
    teacher2 = rng.standard_normal((64, CLASSES)) / 2.0
    x = rng.standard_normal((n, FEATURES)) @ mixing
    logits = np.tanh(x @ teacher1 * 2.0) @ teacher2
    y = np.argmax(logits + 0.3 * rng.standard_normal(logits.shape), axis=1)
    return x.astype(np.float32), y


# ---- the model: 32 -> 256 -> 256 -> 10, ReLU, softmax cross-entropy --------

def init_params(seed):
    rng = np.random.default_rng(seed)
    shapes = [(FEATURES, HIDDEN), (HIDDEN,), (HIDDEN, HIDDEN), (HIDDEN,), (HIDDEN, CLASSES), (CLASSES,)]
    params = []
    for shape in shapes:
        if len(shape) == 2:
            params.append((rng.standard_normal(shape) * np.sqrt(2.0 / shape[0])).astype(np.float32))
        else:
            params.append(np.zeros(shape, np.float32))
    return params


def loss_and_grads(params, x, y):
    w1, b1, w2, b2, w3, b3 = params
    h1 = np.maximum(x @ w1 + b1, 0)
    h2 = np.maximum(h1 @ w2 + b2, 0)
    logits = h2 @ w3 + b3
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    n = len(y)
    loss = -np.log(p[np.arange(n), y] + 1e-12).mean()
    d = p
    d[np.arange(n), y] -= 1
    d /= n
    g3, gb3 = h2.T @ d, d.sum(0)
    d2 = (d @ w3.T) * (h2 > 0)
    g2, gb2 = h1.T @ d2, d2.sum(0)
    d1 = (d2 @ w2.T) * (h1 > 0)
    g1, gb1 = x.T @ d1, d1.sum(0)
    grads = [g.astype(np.float32) for g in (g1, gb1, g2, gb2, g3, gb3)]
    return float(loss), grads


def accuracy(params, x, y):
    w1, b1, w2, b2, w3, b3 = params
    h = np.maximum(np.maximum(x @ w1 + b1, 0) @ w2 + b2, 0)
    return float(np.mean(np.argmax(h @ w3 + b3, axis=1) == y))


# ---- training --------------------------------------------------------------

OPTIMIZERS = {
    "Adam": lambda steps: {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 1e-4}}},
    "1-bit Adam": lambda steps: {"optimizer": {"type": "OneBitAdam", "params": {
        "lr": 1e-3, "weight_decay": 1e-4, "freeze_step": max(2, int(0.15 * steps))}}},
}


def train(name, config, comm, world, rank, data, steps, batch, log_every):
    x, y, x_test, y_test = data
    params = init_params(seed=7)
    history = {"loss": [], "bytes": [], "compressed": []}
    per_rank = batch // world
    order = np.random.default_rng(11)
    mpi = MPI.COMM_WORLD if (MPI is not None and world > 1) else None
    start = time.perf_counter()
    with dsopt.Optimizer(config, params, comm) as opt:
        for step in range(1, steps + 1):
            idx = order.integers(0, len(y), batch)[rank * per_rank:(rank + 1) * per_rank]
            loss, grads = loss_and_grads(params, x[idx], y[idx])
            info = opt.step(grads)
            sent = info.bytes_sent
            if mpi is not None:
                loss = mpi.allreduce(loss) / world
                sent = mpi.allreduce(sent)
            history["loss"].append(loss)
            history["bytes"].append(sent)
            history["compressed"].append(bool(info.compressed))
            if rank == 0 and (step % log_every == 0 or step == 1 or step == steps):
                stage = "compressed" if info.compressed else "full fp32"
                print(f"  [{name}] step {step:4d}/{steps}  loss {loss:.4f}  {stage:10s}  "
                      f"bytes on the wire {sent:>9,d}", flush=True)
    elapsed = time.perf_counter() - start
    return {
        "name": name, "final_loss": float(np.mean(history["loss"][-10:])),
        "initial_loss": history["loss"][0], "test_accuracy": accuracy(params, x_test, y_test),
        "total_bytes": int(sum(history["bytes"])), "seconds": elapsed, "history": history,
    }


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax_loss, ax_bytes) = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in results:
        steps = np.arange(1, len(r["history"]["loss"]) + 1)
        ax_loss.plot(steps, r["history"]["loss"], label=r["name"], lw=1)
        ax_bytes.plot(steps, np.cumsum(r["history"]["bytes"]), label=r["name"])
        if any(r["history"]["compressed"]):
            first = r["history"]["compressed"].index(True) + 1
            ax_loss.axvline(first, color="gray", ls=":", lw=1)
            ax_bytes.axvline(first, color="gray", ls=":", lw=1)
    ax_loss.set(xlabel="step", ylabel="training loss", title="Loss (dotted: 1-bit Adam starts compressing)")
    ax_bytes.set(xlabel="step", ylabel="bytes sent, all ranks", title="Cumulative bytes on the wire")
    if any(sum(r["history"]["bytes"]) > 0 for r in results):
        ax_bytes.set_yscale("log")
    else:
        ax_bytes.set_title("Cumulative bytes on the wire (one process: none)")
    for ax in (ax_loss, ax_bytes):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--out", default="out/demo")
    args = ap.parse_args()

    if MPI is not None and MPI.COMM_WORLD.size > 1:
        world, rank = MPI.COMM_WORLD.size, MPI.COMM_WORLD.rank
        comm = dsopt.Communicator.from_mpi4py(MPI.COMM_WORLD)
    else:
        world, rank = 1, 0
        comm = dsopt.Communicator.local()
    if args.batch % world:
        raise SystemExit(f"--batch {args.batch} must be a multiple of the {world} ranks")
    x, y = make_data(10000, seed=1)
    data = (x[:8000], y[:8000], x[8000:], y[8000:])
    if rank == 0:
        n_params = sum(p.size for p in init_params(7))
        print(f"dsopt demo: MLP {FEATURES}-{HIDDEN}-{HIDDEN}-{CLASSES} ({n_params:,} parameters), "
              f"{world} rank(s) ({comm.backend if hasattr(comm, 'backend') else 'mpi' if world > 1 else 'local'}), "
              f"global batch {args.batch}, {args.steps} steps")
        print(f"dsopt: {dsopt.build_info()}" if hasattr(dsopt, "build_info") else "", flush=True)

    results = []
    for name, make_config in OPTIMIZERS.items():
        if rank == 0:
            print(f"\n== {name} ==", flush=True)
        results.append(train(name, make_config(args.steps), comm, world, rank, data, args.steps,
                             args.batch, args.log_every))
    if rank != 0:
        return
    print("\n{:<12} {:>11} {:>14} {:>18} {:>9}".format("optimizer", "final loss", "test accuracy",
                                                      "bytes on the wire", "time"))
    for r in results:
        print("{:<12} {:>11.4f} {:>14.3f} {:>18,d} {:>8.1f}s".format(
            r["name"], r["final_loss"], r["test_accuracy"], r["total_bytes"], r["seconds"]))
    if world > 1:
        ratio = results[0]["total_bytes"] / max(1, results[1]["total_bytes"])
        print(f"\n1-bit Adam sent {ratio:.1f}x fewer bytes than Adam over the whole run "
              f"(warmup included); its final loss is {results[1]['final_loss'] / results[0]['final_loss']:.3f}x Adam's.")
    os.makedirs(args.out, exist_ok=True)
    plot_path = os.path.join(args.out, "demo.png")
    plot(results, plot_path)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump({"world": world, "results": [{k: v for k, v in r.items() if k != "history"} for r in results]},
                  f, indent=2)
    print(f"plot: {plot_path}")


if __name__ == "__main__":
    main()
