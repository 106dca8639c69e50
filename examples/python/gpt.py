"""A small pre-LayerNorm GPT in plain torch, and byte-level corpora that a
Debian system always has, for training runs of the dsopt optimizers on a
transformer language model.

* ``GPTConfig`` (vocabulary, context, width, depth, heads, MLP ratio) and
  ``CONFIGS``, the named sizes; ``build_model(config, seed)`` gives the same
  initial weights for a seed whatever optimizer trains them.
* ``load_corpus(name)``: the bytes of a fixed list of text files, each
  file's last 10% held out for validation:

  - ``licenses``: the license texts of ``/usr/share/common-licenses``
    (Debian's base-files package);
  - ``python``: modules of the running Python's standard library (on Debian
    ``/usr/lib/python3.X``, package libpython3.X-minimal).

  Tokens are bytes (vocabulary 256): the rows of bytes a text never uses
  never get a gradient.
* ``train_batch(corpus, step, batch, context, seed)``: the global batch of a
  step, the same for a (seed, step) pair on every rank and for every
  optimizer; ``validation_loss(model, corpus, context)`` over fixed windows
  of the held-out text.
* ``warmup_cosine(steps)``: the learning-rate schedule of the runs, a
  ``torch.optim.lr_scheduler.LambdaLR`` factor.

Works with torch 1.13 and 2.x: attention is written out (no
scaled_dot_product_attention).
"""
import math
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 256      # byte-level tokens
    context: int = 64     # tokens per sequence
    width: int = 64       # embedding and residual width
    depth: int = 2        # transformer blocks
    heads: int = 4        # attention heads (width % heads == 0)
    mlp_ratio: int = 4    # hidden width of each block's MLP / width


CONFIGS = {
    "tiny": GPTConfig(context=32, width=32, depth=2, heads=4),    # 42,880 parameters
    "small": GPTConfig(context=64, width=48, depth=2, heads=4),   # 84,288 parameters
}


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        if config.width % config.heads:
            raise ValueError(f"width {config.width} is not a multiple of heads {config.heads}")
        self.heads = config.heads
        self.qkv = nn.Linear(config.width, 3 * config.width)
        self.proj = nn.Linear(config.width, config.width)
        mask = torch.tril(torch.ones(config.context, config.context, dtype=torch.bool))
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        batch, tokens, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        # (batch, heads, tokens, head width)
        q, k, v = (t.view(batch, tokens, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~self.mask[:tokens, :tokens], float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(batch, tokens, width))


class Block(nn.Module):
    """x + attention(LayerNorm(x)), then + MLP(LayerNorm(x))."""

    def __init__(self, config):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.width)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.width)
        hidden = config.mlp_ratio * config.width
        self.mlp = nn.Sequential(nn.Linear(config.width, hidden), nn.GELU(), nn.Linear(hidden, config.width))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.tokens = nn.Embedding(config.vocab, config.width)
        self.positions = nn.Embedding(config.context, config.width)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.depth))
        self.ln_f = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab, bias=False)

    def forward(self, idx):
        """idx: (batch, tokens) int64 -> logits (batch, tokens, vocab)."""
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def loss(self, x, y):
        logits = self(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def build_model(config, seed):
    """A GPT of `config` (a GPTConfig or a name of CONFIGS) with weights from
    `seed` alone: GPT-2's initialisation (normal(0, 0.02), the residual
    projections scaled by 1/sqrt(2 depth), zero biases, unit LayerNorms),
    drawn from a generator of its own in parameter order."""
    if isinstance(config, str):
        config = CONFIGS[config]
    model = GPT(config)
    gen = torch.Generator().manual_seed(seed)
    residual_std = 0.02 / math.sqrt(2 * config.depth)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
            elif ".ln" in name or name.startswith("ln_"):
                p.fill_(1.0)
            else:
                std = residual_std if name.endswith(("attn.proj.weight", "mlp.2.weight")) else 0.02
                p.normal_(0.0, std, generator=gen)
    return model


# ---- corpora ---------------------------------------------------------------------------

LICENSES = Path("/usr/share/common-licenses")
CORPUS_FILES = {
    "licenses": [LICENSES / n for n in ("GPL-3", "GPL-2", "LGPL-2.1", "Apache-2.0", "MPL-2.0", "GFDL-1.3",
                                        "Artistic", "BSD", "CC0-1.0")],
    "python": [Path(sysconfig.get_path("stdlib")) / n for n in ("argparse.py", "textwrap.py", "shutil.py",
                                                                "string.py", "csv.py", "calendar.py")],
}
VALIDATION_FRACTION = 0.1


@dataclass
class Corpus:
    name: str
    train: np.ndarray       # uint8 bytes: each file's first 90%, concatenated
    validation: np.ndarray  # each file's last 10%, concatenated


def load_corpus(name):
    """The corpus `name` (a key of CORPUS_FILES); FileNotFoundError names a
    missing file."""
    train, validation = [], []
    for path in CORPUS_FILES[name]:
        data = np.frombuffer(path.read_bytes(), dtype=np.uint8)
        cut = int(len(data) * (1 - VALIDATION_FRACTION))
        train.append(data[:cut])
        validation.append(data[cut:])
    return Corpus(name, np.concatenate(train), np.concatenate(validation))


def _windows(data, starts, context):
    rows = starts[:, None] + np.arange(context + 1)[None, :]
    tokens = torch.from_numpy(data[rows].astype(np.int64))
    return tokens[:, :-1], tokens[:, 1:]


def train_batch(corpus, step, batch, context, seed):
    """(inputs, targets), each (batch, context) int64: `batch` windows of
    the training text at offsets drawn from (seed, step) alone, so every
    rank and every optimizer sees the same global batch at a step. A rank
    takes its rows of it."""
    draw = np.random.default_rng([seed, step])
    starts = draw.integers(0, len(corpus.train) - context - 1, size=batch)
    return _windows(corpus.train, starts, context)


def validation_windows(corpus, context, limit=64):
    """Up to `limit` fixed windows spread evenly over the held-out text."""
    last = len(corpus.validation) - context - 1
    count = min(limit, last // context)
    starts = np.linspace(0, last, count).astype(np.int64)
    return _windows(corpus.validation, starts, context)


def validation_loss(model, corpus, context, limit=64):
    """Mean next-byte cross-entropy (nats) over validation_windows."""
    x, y = validation_windows(corpus, context, limit)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        loss = float(model.loss(x, y))
    model.train(was_training)
    return loss


# The runs' schedule: a linear warmup over WARMUP_FRACTION of the steps,
# then a cosine down to FINAL_LR_FRACTION of the peak.
WARMUP_FRACTION = 0.10
FINAL_LR_FRACTION = 0.10


def warmup_cosine(steps, warmup_fraction=WARMUP_FRACTION, final=FINAL_LR_FRACTION):
    """LambdaLR's factor of step s: linear warmup to 1, then a cosine to
    `final` at `steps`, constant after."""
    warmup = max(1, int(warmup_fraction * steps))

    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, steps - warmup))
        return final + (1 - final) * 0.5 * (1 + math.cos(math.pi * progress))
    return factor
