"""A small real training problem for 1-bit Adam against Adam: multinomial
logistic regression on generated data (labels sampled from a random
teacher's softmax, so the best loss is well above zero and unique: the
problem is convex), data-parallel: each global batch is split evenly over
the ranks, each rank passes the mean gradient of its share. Both optimizers
see the same data and the same learning-rate schedule; 1-bit Adam warms up
for WARMUP_FRACTION of the steps."""

import numpy as np

import dsopt

FEATURES, CLASSES = 64, 10
SAMPLES = 8192
BATCH = 256
STEPS = 300
WARMUP_FRACTION = 0.15
LR = 1e-2


def dataset():
    rng = np.random.default_rng(2024)
    x = rng.standard_normal((SAMPLES, FEATURES))
    teacher = rng.standard_normal((FEATURES, CLASSES)) * 1.5 / np.sqrt(FEATURES)
    logits = x @ teacher
    y = np.argmax(logits + rng.gumbel(size=logits.shape), axis=1)
    return x, y


def initial_params():
    return [np.zeros((FEATURES, CLASSES), np.float32), np.zeros(CLASSES, np.float32)]


def loss_and_grads(params, x, y):
    w, b = (p.astype(np.float64) for p in params)
    logits = x @ w + b
    logits -= logits.max(axis=1, keepdims=True)
    prob = np.exp(logits)
    prob /= prob.sum(axis=1, keepdims=True)
    n = x.shape[0]
    loss = -np.mean(np.log(prob[np.arange(n), y]))
    d = prob
    d[np.arange(n), y] -= 1.0
    d /= n
    return loss, [(x.T @ d).astype(np.float32), d.sum(axis=0).astype(np.float32)]


def lr_at(step):
    """Linear warmup over 10 steps, then cosine decay to 5%."""
    if step < 10:
        return LR * (step + 1) / 10
    t = (step - 10) / (STEPS - 10)
    return LR * (0.05 + 0.95 * 0.5 * (1.0 + np.cos(np.pi * t)))


def train(config, comm, rank, world):
    x, y = dataset()
    params = initial_params()
    local = BATCH // world
    losses = []
    compressed = 0
    with dsopt.Optimizer(config, params, comm=comm) as opt:
        for step in range(STEPS):
            batch = np.random.default_rng([99, step]).choice(SAMPLES, BATCH, replace=False)
            mine = batch[rank * local:(rank + 1) * local]
            _, grads = loss_and_grads(params, x[mine], y[mine])
            opt.lr = lr_at(step)
            info = opt.step([g.ravel() for g in grads])
            compressed += info.compressed
            if step % 25 == 24 or step == STEPS - 1:
                losses.append(loss_and_grads(params, x, y)[0])
    return np.array(losses), compressed


def train_both(comm, rank, world):
    freeze = int(STEPS * WARMUP_FRACTION)
    adam, _ = train({"optimizer": {"type": "Adam", "params": {"lr": LR}}, "threads": 1}, comm, rank, world)
    onebit, compressed = train({"optimizer": {"type": "OneBitAdam", "params": {"lr": LR, "freeze_step": freeze}},
                                "threads": 1}, comm, rank, world)
    return {"adam": adam, "onebit": onebit, "compressed_steps": np.array(compressed)}
