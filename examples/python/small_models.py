"""Small real models for the demo, the convergence tests and the freeze_step
guidance table: plain numpy forward and backward passes, data-parallel
batches, and a training loop around any dsopt config.

- ``digits``: a ReLU MLP 64-128-128-10 on scikit-learn's bundled
  ``load_digits`` (1797 8x8 images, 80/20 split). Several input pixels are
  never lit, so their first-layer weights never get a gradient.

Every rank builds the same data and the same initial parameters from the
seed; each global batch is split evenly over the ranks, and each rank passes
the mean gradient of its share (what dsopt_step expects).
"""
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Dataset:
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def load_digits_split(seed=0):
    """scikit-learn's digits, pixels scaled to [0, 1], a fixed 80/20 split."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    order = np.random.RandomState(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    return Dataset(x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]])


class MLP:
    """ReLU MLP with softmax cross-entropy; parameters [W1, b1, W2, b2, ...]
    with W of shape (fan_in, fan_out), initialised like torch.nn.Linear
    (uniform in +-1/sqrt(fan_in))."""

    def __init__(self, sizes=(64, 128, 128, 10)):
        self.sizes = tuple(sizes)

    def init_params(self, seed):
        rng = np.random.RandomState(seed)
        params = []
        for fan_in, fan_out in zip(self.sizes[:-1], self.sizes[1:]):
            bound = 1.0 / np.sqrt(fan_in)
            params.append(rng.uniform(-bound, bound, (fan_in, fan_out)).astype(np.float32))
            params.append(rng.uniform(-bound, bound, (fan_out,)).astype(np.float32))
        return params

    def num_params(self):
        return sum(a * b + b for a, b in zip(self.sizes[:-1], self.sizes[1:]))

    def _forward(self, params, x):
        acts = [x]
        layers = len(params) // 2
        h = x
        for layer in range(layers):
            z = h @ params[2 * layer] + params[2 * layer + 1]
            h = np.maximum(z, 0.0) if layer < layers - 1 else z
            acts.append(h)
        return acts

    @staticmethod
    def _softmax(logits):
        z = logits - logits.max(axis=1, keepdims=True)
        p = np.exp(z)
        return p / p.sum(axis=1, keepdims=True)

    def loss_and_grads(self, params, x, y):
        """Mean cross-entropy over the batch and its gradient per parameter."""
        acts = self._forward(params, x)
        prob = self._softmax(acts[-1])
        n = len(y)
        with np.errstate(divide="ignore"):
            loss = float(-np.mean(np.log(prob[np.arange(n), y])))
        d = prob
        d[np.arange(n), y] -= 1.0
        d /= n
        grads = [None] * len(params)
        for layer in reversed(range(len(params) // 2)):
            grads[2 * layer] = acts[layer].T @ d
            grads[2 * layer + 1] = d.sum(axis=0)
            if layer > 0:
                d = (d @ params[2 * layer].T) * (acts[layer] > 0)
        return loss, [g.astype(np.float32) for g in grads]

    def evaluate(self, params, x, y):
        """(mean loss, accuracy); NaN parameters give loss NaN."""
        with np.errstate(all="ignore"):
            logits = self._forward(params, x)[-1]
            prob = self._softmax(logits)
            loss = float(-np.mean(np.log(prob[np.arange(len(y)), y])))
            acc = float(np.mean(np.argmax(logits, axis=1) == y))
        return loss, acc


@dataclass
class RunResult:
    train_loss: float            # on the whole training set, after the last step
    test_accuracy: float
    skipped: int                 # steps skipped for non-finite gradients
    error: str = ""              # the dsopt error that ended the run early, if any
    bytes_sent: int = 0          # this rank's bytes through the communicator
    losses: list = field(default_factory=list)  # this rank's batch loss per step


def train(model, data, config, comm, rank, world, steps=300, batch=64, seed=0, on_step=None):
    """Trains `model` on `data` with a dsopt optimizer built from `config`
    (a dict) over `comm`. Every rank calls it with the same arguments. A
    dsopt.NonFiniteError (the run stopped progressing) ends the run early
    and is reported in the result; other errors propagate."""
    import dsopt

    params = model.init_params(seed)
    local = batch // world
    draw = np.random.RandomState(seed + 1000)
    result = RunResult(float("nan"), 0.0, 0)
    with dsopt.Optimizer(config, params, comm=comm) as opt:
        for step in range(steps):
            idx = draw.choice(len(data.y_train), batch, replace=False)[rank * local:(rank + 1) * local]
            loss, grads = model.loss_and_grads(params, data.x_train[idx], data.y_train[idx])
            try:
                info = opt.step([g.ravel() for g in grads])
            except dsopt.NonFiniteError as e:
                result.error = str(e)
                result.skipped += 1
                break
            result.skipped += int(info.skipped)
            result.bytes_sent += int(info.bytes_sent)
            result.losses.append(loss)
            if on_step is not None:
                on_step(step, loss, info)
    result.train_loss, _ = model.evaluate(params, data.x_train, data.y_train)
    _, result.test_accuracy = model.evaluate(params, data.x_test, data.y_test)
    return result
