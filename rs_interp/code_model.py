"""A GPT-2-architecture toy trained here on real text: the Python sources of the pinned torch.

**Status: the training code works, no model is shipped.** With the recorded settings (2,500 steps
of 16 x 128 tokens, ~9 minutes on 2 cores) the model beats the unigram baseline by 2.5 nats on
held-out files, but forms no induction head: on repeated random tokens the repeat costs as much as
the first occurrence. Measured so far: curricula of repeated code and repeated random spans (up to
every row), learning rates from 1e-3 to 1e-2, batches of 32, spans of random length at random
places (a fixed offset lets one head copy from that offset, a shortcut that is not induction), and
learned positions started at the sinusoidal table: none formed a previous-token head (largest
weight on ``i - 1`` at most 0.22) within the budget. The rotary toy models form both in 1,000 steps
of 64 sequences. ``rs-interp train code-2l`` trains and saves one.

Pretrained GPT-2 cannot be downloaded here, and random weights have no circuits. So this module
builds, from text every install has offline, a small model with everything GPT-2 has (LayerNorm,
GELU MLPs, learned positions, every bias):

- **corpus**: the ``.py`` files of ``torch/nn/modules``, ``torch/optim`` and ``torch/distributions``
  of the installed torch (pinned to 2.13.0 by the set-up script), read in sorted path order and
  recorded by sha256; a file goes to the held-out split when the first byte of its path's sha256 is
  below 26 (about 10%). Identifiers, docstrings and comments repeat, which induction heads feed on.
- **tokenizer**: ``tokenizers``' byte-level BPE with :data:`CODE_VOCAB` tokens, trained on the
  training split and shipped beside the weights.
- **model**: :func:`code_model_config`; trained by :func:`rs_interp.training.train_on_batches`
  (Adam, one thread, a recorded seed) on random windows of the training stream.

A trained model loads with :func:`rs_interp.load_model`, its tokenizer with :func:`load_code_tokenizer`.

>>> cfg = code_model_config()
>>> (cfg.n_layers, cfg.d_model, cfg.normalization_type, cfg.positional_embedding_type)
(2, 128, 'LN', 'standard')
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from ._backend import Model, ModelConfig, make_config

from ._validate import check_int_range, check_tokens
from .models import build_model

__all__ = [
    "CODE_TRAINING",
    "CODE_VOCAB",
    "CodeCorpus",
    "code_corpus",
    "code_model_config",
    "train_code_tokenizer",
    "load_code_tokenizer",
    "encode_corpus",
    "train_code_model",
    "heldout_loss",
    "unigram_loss",
    "repeated_sequence_losses",
]

#: Tokenizer size.
CODE_VOCAB = 2048
#: Folders of the installed torch whose ``.py`` files make the corpus, in this order.
CORPUS_FOLDERS = ("nn/modules", "optim", "distributions")
#: The recorded training settings of the shipped ``code-2l``.
CODE_TRAINING = dict(steps=2500, batch_size=16, lr=1e-3, seed=0, repeat_fraction=0.5, random_fraction=0.25)
#: The end-of-file token between documents.
EOT = "<|endoftext|>"


@dataclass(frozen=True)
class CodeCorpus:
    """The corpus, split by file.

    Attributes:
        train, heldout: the file texts of each split, in sorted path order.
        paths: (train paths, held-out paths), relative to the torch package.
        sha256: of every file's path and bytes, in order: the corpus's identity.
        torch_version: the torch whose sources these are.
    """

    train: tuple[str, ...]
    heldout: tuple[str, ...]
    paths: tuple[tuple[str, ...], tuple[str, ...]]
    sha256: str
    torch_version: str


def code_corpus() -> CodeCorpus:
    """Read the corpus from the installed torch (see the module docstring)."""
    root = Path(torch.__file__).parent
    files = sorted(p for folder in CORPUS_FOLDERS for p in (root / folder).rglob("*.py"))
    if not files:
        raise FileNotFoundError(f"no Python sources under {root} for {CORPUS_FOLDERS}")
    digest = hashlib.sha256()
    train, heldout, tp, hp = [], [], [], []
    for p in files:
        rel = p.relative_to(root).as_posix()
        data = p.read_bytes()
        digest.update(rel.encode() + b"\0" + data + b"\0")
        text = data.decode("utf-8")
        if hashlib.sha256(rel.encode()).digest()[0] < 26:
            heldout.append(text), hp.append(rel)
        else:
            train.append(text), tp.append(rel)
    return CodeCorpus(tuple(train), tuple(heldout), (tuple(tp), tuple(hp)), digest.hexdigest(), torch.__version__)


def code_model_config(**overrides: Any) -> ModelConfig:
    """GPT-2's architecture at toy size: 2 layers, ``d_model=128``, 4 heads of 32, GELU MLPs of 512,
    LayerNorm, learned positions, context 128, :data:`CODE_VOCAB` tokens."""
    fields: dict[str, Any] = dict(n_layers=2, d_model=128, n_heads=4, d_head=32, d_mlp=512, d_vocab=CODE_VOCAB, n_ctx=128,
                                  act_fn="gelu_new", normalization_type="LN", positional_embedding_type="standard",
                                  seed=None, device="cpu")
    fields.update(overrides)
    return make_config(**fields)


def train_code_tokenizer(corpus: CodeCorpus, vocab_size: int = CODE_VOCAB):
    """A byte-level BPE tokenizer (``tokenizers``) trained on the training split."""
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(list(corpus.train), vocab_size=vocab_size, min_frequency=2, special_tokens=[EOT], show_progress=False)
    return tok


def load_code_tokenizer(model_path: str | Path):
    """The tokenizer saved beside a ``code-2l`` checkpoint (``PATH.tokenizer.json``), a ``tokenizers.Tokenizer``."""
    from tokenizers import Tokenizer

    path = Path(model_path)
    return Tokenizer.from_file(str(path.with_name(path.name + ".tokenizer.json")))


def encode_corpus(tokenizer, texts: tuple[str, ...]) -> torch.Tensor:
    """One stream of token ids: every text followed by the end-of-file token."""
    eot = tokenizer.token_to_id(EOT)
    ids: list[int] = []
    for enc in tokenizer.encode_batch(list(texts)):
        ids.extend(enc.ids)
        ids.append(eot)
    return torch.tensor(ids, dtype=torch.long)


def _windows(stream: torch.Tensor, n: int, width: int, generator: torch.Generator, repeat_fraction: float = 0.0,
             random_fraction: float = 0.0, d_vocab: int = CODE_VOCAB) -> torch.Tensor:
    """``n`` random windows of ``width`` tokens of the stream. The curriculum that lets induction form
    within minutes: in the last ``round(n * repeat_fraction)`` rows a span of random length
    ``8 .. width // 2`` at a random place is written twice in a row, and of those the last
    ``round(n * random_fraction)`` spans are uniform random tokens.

    The length and the place vary from row to row: with a fixed offset (every repeat ``width // 2``
    back) a single head learns to copy from that position, a positional shortcut that fails on any
    other offset, and no induction head forms."""
    starts = torch.randint(0, len(stream) - width, (n,), generator=generator)
    out = stream[starts[:, None] + torch.arange(width)]
    k, r = round(n * repeat_fraction), round(n * random_fraction)
    for row in range(n - k, n):
        length = int(torch.randint(8, width // 2 + 1, (1,), generator=generator))
        at = int(torch.randint(0, width - 2 * length + 1, (1,), generator=generator))
        if row >= n - r:
            out[row, at : at + length] = torch.randint(0, d_vocab, (length,), generator=generator)
        out[row, at + length : at + 2 * length] = out[row, at : at + length]
    return out


def train_code_model(*, steps: int = CODE_TRAINING["steps"], batch_size: int = CODE_TRAINING["batch_size"],
                     lr: float = CODE_TRAINING["lr"], seed: int = CODE_TRAINING["seed"],
                     repeat_fraction: float = CODE_TRAINING["repeat_fraction"],
                     random_fraction: float = CODE_TRAINING["random_fraction"], progress: bool = True,
                     tokenizer=None) -> tuple[Model, Any, dict]:
    """Train ``code-2l`` from scratch: returns the model, its tokenizer and the metadata to ship
    (settings, corpus hash, held-out and unigram losses, the loss curve every 50 steps).

    The tokenizer is trained too unless one is given (the shipped one, for a retraining check).
    """
    from .training import train_on_batches

    check_int_range("steps", steps, 1)
    check_int_range("batch_size", batch_size, 1)
    corpus = code_corpus()
    tokenizer = tokenizer or train_code_tokenizer(corpus)
    train_ids, held_ids = encode_corpus(tokenizer, corpus.train), encode_corpus(tokenizer, corpus.heldout)
    cfg = code_model_config()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_model(cfg)
    gen = torch.Generator().manual_seed(seed + 1)
    mask = torch.ones(batch_size, cfg.n_ctx - 1, dtype=torch.bool)
    if not 0.0 <= random_fraction <= repeat_fraction <= 1.0:
        raise ValueError(f"need 0 <= random_fraction <= repeat_fraction <= 1, got {random_fraction}, {repeat_fraction}")
    batches = lambda _: (_windows(train_ids, batch_size, cfg.n_ctx, gen, repeat_fraction, random_fraction, cfg.d_vocab), mask)  # noqa: E731
    losses = train_on_batches(model, batches, steps=steps, lr=lr,
                              progress=progress, desc="training code-2l", params=list(model.parameters()))
    meta = {"training": dict(steps=steps, batch_size=batch_size, lr=lr, seed=seed, repeat_fraction=repeat_fraction,
                             random_fraction=random_fraction),
            "corpus": {"folders": list(CORPUS_FOLDERS), "sha256": corpus.sha256, "torch": corpus.torch_version,
                       "files": [len(corpus.train), len(corpus.heldout)], "tokens": [len(train_ids), len(held_ids)]},
            "heldout_loss": heldout_loss(model, held_ids), "unigram_loss": unigram_loss(train_ids, held_ids, cfg.d_vocab),
            "loss_curve": losses[::50]}
    return model, tokenizer, meta


def heldout_loss(model: Model, stream: torch.Tensor, *, max_windows: int = 256) -> float:
    """Mean next-token loss on consecutive non-overlapping windows of ``stream`` (at most ``max_windows``)."""
    width = model.cfg.n_ctx
    n = min(max_windows, len(stream) // width)
    if n < 1:
        raise ValueError(f"stream has {len(stream)} tokens, fewer than one window of {width}")
    windows = stream[: n * width].reshape(n, width)
    with torch.no_grad():
        return float(model(windows, return_type="loss"))


def unigram_loss(train: torch.Tensor, heldout: torch.Tensor, d_vocab: int) -> float:
    """Cross-entropy of ``heldout`` under the training split's token frequencies (add-one smoothed):
    the loss of a model that ignores context."""
    counts = torch.bincount(train, minlength=d_vocab).double() + 1
    logp = (counts / counts.sum()).log()
    return float(-logp[heldout].mean())


def repeated_sequence_losses(model: Model, *, n: int = 64, half: int = 50, seed: int = 0) -> tuple[float, float]:
    """Loss on the first and on the second occurrence of ``n`` random token sequences of length
    ``half`` repeated once: (first, repeat). Induction makes the repeat cheap."""
    check_int_range("half", half, 2, model.cfg.n_ctx // 2)
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, model.cfg.d_vocab, (n, half), generator=g)
    tokens = check_tokens(model, torch.cat([seq, seq], 1))
    with torch.no_grad():
        per = model(tokens, return_type="loss", loss_per_token=True)  # (n, 2*half - 1): predicting token i+1
    return float(per[:, : half - 1].mean()), float(per[:, half:].mean())
