"""The digits CNN of examples/python/small_models.py (ConvNet): its forward
pass against a convolution written as loops over output positions and
kernel taps, and its gradients against central differences, on random
parameters and random images (float64, so the differences are exact to
~1e-7)."""

import sys

import numpy as np

import conftest

sys.path.insert(0, str(conftest.REPO_ROOT / "examples" / "python"))
from small_models import ConvNet  # noqa: E402


def conv3x3(images, kernel, bias, stride):
    """Zero padding 1; kernel rows ordered (row, column, channel)."""
    n, side, _, c = images.shape
    out = (side - 1) // stride + 1
    padded = np.zeros((n, side + 2, side + 2, c))
    padded[:, 1:-1, 1:-1] = images
    taps = kernel.reshape(3, 3, c, -1)
    result = np.tile(bias, (n, out, out, 1)).astype(np.float64)
    for r in range(out):
        for q in range(out):
            for i in range(3):
                for j in range(3):
                    result[:, r, q] += padded[:, stride * r + i, stride * q + j] @ taps[i, j]
    return result


def random_case(seed, n=5, channels=(3, 4)):
    rng = np.random.RandomState(seed)
    model = ConvNet(channels)
    params = [rng.standard_normal(p.shape) * 0.5 for p in model.init_params(seed)]
    return model, params, rng.uniform(0, 1, (n, 64)), rng.randint(0, 10, n)


def test_forward_is_the_convolutions_written_out():
    model, (k1, b1, k2, b2, w, b), x, _ = random_case(1)
    h1 = np.maximum(conv3x3(x.reshape(-1, 8, 8, 1), k1, b1, 1), 0)
    h2 = np.maximum(conv3x3(h1, k2, b2, 2), 0)
    assert h2.shape == (len(x), 4, 4, 4)
    expected = h2.reshape(len(x), -1) @ w + b
    got = model._forward([k1, b1, k2, b2, w, b], x)[-1]
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert model.num_params() == sum(p.size for p in model.init_params(0)) == 9 * 3 + 3 + 27 * 4 + 4 + 64 * 10 + 10


def test_gradients_are_central_differences():
    model, params, x, y = random_case(2)
    _, grads = model.loss_and_grads(params, x, y)
    rng = np.random.RandomState(3)
    h = 1e-6
    for t, (p, g) in enumerate(zip(params, grads)):
        for flat in rng.choice(p.size, min(p.size, 12), replace=False):
            where = np.unravel_index(flat, p.shape)
            saved = p[where]
            p[where] = saved + h
            up = model.loss_and_grads(params, x, y)[0]
            p[where] = saved - h
            down = model.loss_and_grads(params, x, y)[0]
            p[where] = saved
            # grads come back in float32
            assert abs(g[where] - (up - down) / (2 * h)) <= 1e-5 * max(1.0, abs(g[where])), (t, where)
