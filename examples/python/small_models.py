"""Small real models for the demo, the convergence tests and the freeze_step
guidance table: plain numpy forward and backward passes, data-parallel
batches, and a training loop around any dsopt config.

- ``digits``: a ReLU MLP 64-128-128-10 on scikit-learn's bundled
  ``load_digits`` (1797 8x8 images, 80/20 split). Several input pixels are
  never lit, so their first-layer weights never get a gradient.
- ``chars``: a next-byte predictor on the GPL-3 text Debian ships in
  ``/usr/share/common-licenses`` (package base-files): the 4 previous bytes,
  each through a 256-row embedding table, -> ReLU hidden layer -> softmax
  over 256 bytes. The text uses 76 distinct bytes, so 180 embedding rows
  never get a gradient, and rare bytes give rows whose second moment is
  tiny.
- ``digits_cnn``: a small convolutional net on the same digits, as 1x8x8
  images: 3x3 convolution 1 -> 16 channels (padding 1), ReLU, 3x3
  convolution 16 -> 32 with stride 2 (padding 1, to 4x4), ReLU, linear
  512 -> 10; 9,930 parameters, the convolutions as matrix products over
  the images' 3x3 patches.

Every rank builds the same data and the same initial parameters from the
seed; each global batch is split evenly over the ranks, and each rank passes
the mean gradient of its share (what dsopt_step expects).
"""
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class Dataset:
    """x: float features (digits) or integer byte indices (chars); y: class indices."""
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def _digits_pixels_and_labels():
    # Importing sklearn takes seconds (4 ranks on 2 cores: 7 s per launch),
    # so read the CSV it bundles for load_digits directly when it is there.
    spec = importlib.util.find_spec("sklearn")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        csv = Path(folder) / "datasets" / "data" / "digits.csv.gz"
        if csv.exists():
            table = np.loadtxt(csv, delimiter=",")
            return table[:, :-1], table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    return load_digits(return_X_y=True)


def load_digits_split(seed=0):
    """scikit-learn's digits, pixels scaled to [0, 1], a fixed 80/20 split."""
    x, y = _digits_pixels_and_labels()
    x = (x / 16.0).astype(np.float32)
    order = np.random.RandomState(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    return Dataset(x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]])


def _softmax(logits):
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=1, keepdims=True)


def _cross_entropy(logits, y):
    """(mean loss, d loss / d logits); NaN logits give loss NaN."""
    prob = _softmax(logits)
    n = len(y)
    with np.errstate(divide="ignore"):
        loss = float(-np.mean(np.log(prob[np.arange(n), y])))
    prob[np.arange(n), y] -= 1.0
    return loss, prob / n


def _loss_and_accuracy(logits, y):
    loss, _ = _cross_entropy(logits, y)
    return loss, float(np.mean(np.argmax(logits, axis=1) == y))


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

    def loss_and_grads(self, params, x, y):
        """Mean cross-entropy over the batch and its gradient per parameter."""
        acts = self._forward(params, x)
        loss, d = _cross_entropy(acts[-1], y)
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
            return _loss_and_accuracy(self._forward(params, x)[-1], y)


class _Patches:
    """The 3x3 patches of NHWC images of side `side` padded by 1, at every
    `stride`-th position, each patch ordered (row, column, channel): a
    gather from the padded image and, backward, the sum into it of each of
    the 9 offsets' strided slices."""

    def __init__(self, side, stride):
        self.side, self.stride, self.out = side, stride, (side - 1) // stride + 1
        padded = side + 2
        corners = (np.arange(self.out) * stride)[:, None] * padded + np.arange(self.out) * stride
        offsets = np.arange(3)[:, None] * padded + np.arange(3)
        self.index = (corners.reshape(-1, 1) + offsets.reshape(1, -1)).ravel()  # (out^2 9,)

    def __call__(self, x):
        """(n out^2, 9 c): the patches of x of shape (n, side, side, c), rows
        in (image, row, column) order."""
        n, c = len(x), x.shape[-1]
        padded = np.zeros((n, self.side + 2, self.side + 2, c), dtype=x.dtype)
        padded[:, 1:-1, 1:-1, :] = x
        return padded.reshape(n, -1, c)[:, self.index].reshape(-1, 9 * c)

    def backward(self, d_patches, n):
        """The gradient with respect to x (n images) of a loss whose gradient
        with respect to self(x) is `d_patches`."""
        c, out, stride = d_patches.shape[-1] // 9, self.out, self.stride
        d = d_patches.reshape(n, out, out, 3, 3, c)
        padded = np.zeros((n, self.side + 2, self.side + 2, c), dtype=d_patches.dtype)
        span = stride * (out - 1) + 1
        for i in range(3):
            for j in range(3):
                padded[:, i:i + span:stride, j:j + span:stride, :] += d[:, :, :, i, j, :]
        return padded[:, 1:-1, 1:-1, :]


class ConvNet:
    """The digits as 1x8x8 images: conv 3x3 1 -> c1 (padding 1), ReLU,
    conv 3x3 c1 -> c2 with stride 2 (padding 1), ReLU, linear 16 c2 -> 10,
    softmax cross-entropy. Parameters [K1, b1, K2, b2, W, b]; a convolution
    kernel has shape (9 c_in, c_out), its rows ordered (row, column,
    channel) as _Patches orders a patch. Initialised like torch's Conv2d and
    Linear: uniform in +-1/sqrt(fan_in)."""

    SIDE = 8

    def __init__(self, channels=(16, 32)):
        self.channels = tuple(channels)
        self.patches1, self.patches2 = _Patches(self.SIDE, 1), _Patches(self.SIDE, 2)

    def _shapes(self):
        c1, c2 = self.channels
        out = self.patches2.out
        return [(9, c1), (9 * c1, c2), (out * out * c2, 10)]

    def init_params(self, seed):
        rng = np.random.RandomState(seed)
        params = []
        for fan_in, fan_out in self._shapes():
            bound = 1.0 / np.sqrt(fan_in)
            params.append(rng.uniform(-bound, bound, (fan_in, fan_out)).astype(np.float32))
            params.append(rng.uniform(-bound, bound, (fan_out,)).astype(np.float32))
        return params

    def num_params(self):
        return sum(a * b + b for a, b in self._shapes())

    def _forward(self, params, x):
        """The patches and activations, one row per image and position."""
        k1, b1, k2, b2, w, b = params
        n, side = len(x), self.SIDE
        p1 = self.patches1(x.reshape(n, side, side, 1))
        h1 = np.maximum(p1 @ k1 + b1, 0.0)
        p2 = self.patches2(h1.reshape(n, side, side, -1))
        h2 = np.maximum(p2 @ k2 + b2, 0.0)
        flat = h2.reshape(n, -1)
        return p1, h1, p2, h2, flat, flat @ w + b

    def loss_and_grads(self, params, x, y):
        """Mean cross-entropy over the batch and its gradient per parameter."""
        _, _, k2, _, w, _ = params
        p1, h1, p2, h2, flat, logits = self._forward(params, x)
        loss, d = _cross_entropy(logits, y)
        g_w, g_b = flat.T @ d, d.sum(axis=0)
        d2 = (d @ w.T).reshape(h2.shape) * (h2 > 0)
        d1 = self.patches2.backward(d2 @ k2.T, len(x)).reshape(h1.shape) * (h1 > 0)
        grads = (p1.T @ d1, d1.sum(axis=0), p2.T @ d2, d2.sum(axis=0), g_w, g_b)
        return loss, [g.astype(np.float32) for g in grads]

    def evaluate(self, params, x, y):
        """(mean loss, accuracy); NaN parameters give loss NaN."""
        with np.errstate(all="ignore"):
            return _loss_and_accuracy(self._forward(params, x)[-1], y)


GPL3_TEXT = "/usr/share/common-licenses/GPL-3"


def load_text_split(path=GPL3_TEXT, context=4, seed=0):
    """Every position of the file as (the `context` previous bytes, the
    byte), a fixed random 90/10 split of the positions."""
    text = np.frombuffer(Path(path).read_bytes(), dtype=np.uint8).astype(np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(text, context + 1)
    x, y = windows[:, :context].copy(), windows[:, context].copy()
    order = np.random.RandomState(seed).permutation(len(y))
    cut = int(0.9 * len(y))
    return Dataset(x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]])


class CharModel:
    """Next-byte predictor: embedding (256, dim) of each context byte,
    concatenated -> ReLU hidden layer -> logits over 256 bytes. Parameters
    [E, W1, b1, W2, b2]; E ~ N(0, 1) like torch.nn.Embedding, the linear
    layers like MLP's."""

    VOCAB = 256

    def __init__(self, context=4, dim=16, hidden=128):
        self.context, self.dim, self.hidden = context, dim, hidden

    def init_params(self, seed):
        rng = np.random.RandomState(seed)
        params = [rng.standard_normal((self.VOCAB, self.dim)).astype(np.float32)]
        for fan_in, fan_out in ((self.context * self.dim, self.hidden), (self.hidden, self.VOCAB)):
            bound = 1.0 / np.sqrt(fan_in)
            params.append(rng.uniform(-bound, bound, (fan_in, fan_out)).astype(np.float32))
            params.append(rng.uniform(-bound, bound, (fan_out,)).astype(np.float32))
        return params

    def num_params(self):
        return (self.VOCAB * self.dim + (self.context * self.dim + 1) * self.hidden
                + (self.hidden + 1) * self.VOCAB)

    def _forward(self, params, x):
        emb, w1, b1, w2, b2 = params
        e = emb[x].reshape(len(x), -1)
        h = np.maximum(e @ w1 + b1, 0.0)
        return e, h, h @ w2 + b2

    def loss_and_grads(self, params, x, y):
        """Mean cross-entropy over the batch and its gradient per parameter."""
        emb, w1, _, w2, _ = params
        e, h, logits = self._forward(params, x)
        loss, d = _cross_entropy(logits, y)
        g_w2, g_b2 = h.T @ d, d.sum(axis=0)
        d = (d @ w2.T) * (h > 0)
        g_w1, g_b1 = e.T @ d, d.sum(axis=0)
        g_emb = np.zeros_like(emb)
        np.add.at(g_emb, x.ravel(), (d @ w1.T).reshape(-1, self.dim))
        return loss, [g.astype(np.float32) for g in (g_emb, g_w1, g_b1, g_w2, g_b2)]

    def evaluate(self, params, x, y):
        """(mean loss, next-byte accuracy); NaN parameters give loss NaN."""
        with np.errstate(all="ignore"):
            return _loss_and_accuracy(self._forward(params, x)[-1], y)
