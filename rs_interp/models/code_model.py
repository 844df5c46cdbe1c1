"""A GPT-2-architecture toy trained here on real text: the Python sources of the pinned torch.

``load_toy_model("code-2l")`` is the shipped one; ``rs-interp train code-2l`` retrains it from its
recorded seed (``SHIPPED_MODELS["code-2l"].settings``: 4,000 Adam steps of 32 x 64 tokens, about 12.5
minutes on one core).

Pretrained GPT-2 cannot be downloaded here, and random weights have no circuits. So this module
builds, from text every install has offline, a small model with everything GPT-2 has (LayerNorm,
GELU MLPs, learned positions, every bias GPT-2 has; no unembedding bias, as in GPT-2):

- **corpus**: the ``.py`` files of ``torch/nn/modules``, ``torch/optim`` and ``torch/distributions``
  of the installed torch (pinned to 2.13.0 by the set-up script), read in sorted path order and
  recorded by sha256; a file goes to the held-out split when the first byte of its path's sha256 is
  below 26 (about 10%). Identifiers, docstrings and comments repeat, which induction heads feed on.
- **tokenizer**: ``tokenizers``' byte-level BPE with :data:`CODE_VOCAB` tokens, trained on the
  training split and shipped beside the weights.
- **model**: :func:`code_model_config`; trained by :func:`rs_interp.models.training.train_on_batches`
  (Adam, one thread, a recorded seed) on batches that are half random windows of the training
  stream and half the toy models' repeated random sequences (see :func:`_batch` for why: on code
  alone no induction head formed within the budget; with them the shipped model's loss drops near step 1,850).

A trained model loads with :func:`rs_interp.models.load_model`, its tokenizer with :func:`load_code_tokenizer`.

>>> cfg = code_model_config()
>>> (cfg.n_layers, cfg.d_model, cfg.normalization_type, cfg.positional_embedding_type)
(2, 128, 'LN', 'standard')
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .._backend import Model, ModelConfig, make_config
from .._files import loading, read_text
from ..exact.validate import check_int_range, check_tokens
from .checkpoints import build_model
from .data import induction_batch

__all__ = [
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
    "repeated_tokens",
    "repeated_sequence_losses",
]

#: Tokenizer size.
CODE_VOCAB = 2048
#: Folders of the installed torch whose ``.py`` files make the corpus, in this order.
CORPUS_FOLDERS = ("nn/modules", "optim", "distributions")
#: Seed of the repeated random sequences whose losses are recorded beside the checkpoint.
REPEAT_SEED = 20_261_130
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
    """GPT-2's architecture at toy size: 2 layers, ``d_model=128``, 2 heads of GPT-2's width 64, GELU MLPs of 512,
    LayerNorm, learned positions, context 64, :data:`CODE_VOCAB` tokens."""
    fields: dict[str, Any] = dict(n_layers=2, d_model=128, n_heads=2, d_head=64, d_mlp=512, d_vocab=CODE_VOCAB,
                                  n_ctx=64, act_fn="gelu_new", normalization_type="LN",
                                  positional_embedding_type="standard", seed=None, device="cpu")
    fields.update(overrides)
    return make_config(**fields)


def train_code_tokenizer(corpus: CodeCorpus, vocab_size: int = CODE_VOCAB):
    """A byte-level BPE tokenizer (``tokenizers``) trained on the training split."""
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(list(corpus.train), vocab_size=vocab_size, min_frequency=2, special_tokens=[EOT],
                            show_progress=False)
    return tok


def read_tokenizer(path: str | Path):
    """The ``tokenizers.Tokenizer`` saved as ``path`` (its JSON).

    Raises:
        rs_interp.FileError: the file is missing, or not a tokenizer ``tokenizers`` can read (named).
    """
    from tokenizers import Tokenizer

    text = read_text(path, "tokenizer file")
    with loading(path, "tokenizer file", "tokenizers"):
        return Tokenizer.from_str(text)


def load_code_tokenizer(model_path: str | Path):
    """The tokenizer saved beside a ``code-2l`` checkpoint (``PATH.tokenizer.json``), a ``tokenizers.Tokenizer``.

    Raises:
        rs_interp.FileError: the file is missing, or not a tokenizer ``tokenizers`` can read (named).
    """
    path = Path(model_path)
    return read_tokenizer(path.with_name(path.name + ".tokenizer.json"))


def encode_corpus(tokenizer, texts: tuple[str, ...]) -> torch.Tensor:
    """One stream of token ids: every text followed by the end-of-file token."""
    eot = tokenizer.token_to_id(EOT)
    ids: list[int] = []
    for enc in tokenizer.encode_batch(list(texts)):
        ids.extend(enc.ids)
        ids.append(eot)
    return torch.tensor(ids, dtype=torch.long)


def _batch(stream: torch.Tensor, n: int, width: int, generator: torch.Generator, periodic_fraction: float,
           d_vocab: int = CODE_VOCAB) -> torch.Tensor:
    """``n`` rows of ``width`` tokens: the first ``round(n * periodic_fraction)`` are the toy models'
    repeated random sequences (:func:`rs_interp.induction_batch`: a block of 6-24 random tokens
    repeated to the end), the rest random windows of the training stream.

    Why the periodic rows: on code alone (and with one repeated span per row, of code or of random
    tokens) no induction head formed within the budget; rows that repeat from start to end make
    copying pay at almost every position, and the circuit forms within the first 2,000 steps (near 1,850 in the
    shipped model)."""
    k = round(n * periodic_fraction)
    starts = torch.randint(0, len(stream) - width, (n - k,), generator=generator)
    code = stream[starts[:, None] + torch.arange(width)]
    if k == 0:
        return code
    periodic = induction_batch(k, generator=generator, d_vocab=d_vocab, seq_len=width).tokens
    return torch.cat([periodic, code])


def train_code_model(*, steps: int, batch_size: int, lr: float, warmup: int, seed: int, periodic_fraction: float,
                     progress: bool = True, tokenizer=None) -> tuple[Model, Any, dict]:
    """Train ``code-2l`` from scratch: returns the model, its tokenizer and the metadata to ship
    (settings, corpus hash, held-out and unigram losses, the loss curve every 50 steps).

    The settings are the recipe's (the shipped model's are ``SHIPPED_MODELS["code-2l"].settings``;
    ``rs_interp.models.train_shipped("code-2l")`` trains with them). The tokenizer is trained too unless one
    is given (the shipped one, for a retraining check).
    """
    from .training import train_on_batches, trainable_parameters

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
    if not 0.0 <= periodic_fraction <= 1.0:
        raise ValueError(f"periodic_fraction must be in [0, 1], got {periodic_fraction}")
    batches = lambda _: (_batch(train_ids, batch_size, cfg.n_ctx, gen, periodic_fraction, cfg.d_vocab),  # noqa: E731
                         mask)
    start = time.perf_counter()
    # GPT-2 has no unembedding bias (TransformerLens 3.x carries a parameter, 4.x's native models a buffer): it
    # stays at zero.
    losses = train_on_batches(model, batches, steps=steps, lr=lr, warmup=warmup, progress=progress,
                              desc="training code-2l", params=trainable_parameters(model, frozen=("b_U",)))
    meta = {"training": dict(steps=steps, batch_size=batch_size, lr=lr, warmup=warmup, seed=seed,
                             periodic_fraction=periodic_fraction, seconds=round(time.perf_counter() - start, 1)),
            "corpus": {"folders": list(CORPUS_FOLDERS), "sha256": corpus.sha256, "torch": corpus.torch_version,
                       "files": [len(corpus.train), len(corpus.heldout)], "tokens": [len(train_ids), len(held_ids)]},
            "heldout_loss": heldout_loss(model, held_ids),
            "unigram_loss": unigram_loss(train_ids, held_ids, cfg.d_vocab),
            **dict(zip(("repeat_first_loss", "repeat_loss"), repeated_sequence_losses(model, seed=REPEAT_SEED))),
            "loss_curve": losses[::50]}
    return model, tokenizer, meta


def heldout_loss(model: Model, stream: torch.Tensor, *, max_windows: int = 1024) -> float:
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


def repeated_tokens(d_vocab: int, *, n: int, half: int, seed: int) -> torch.Tensor:
    """``n`` random sequences of ``half`` tokens, each written twice in a row: a (n, 2 * half) tensor."""
    check_int_range("n", n, 1)
    seq = torch.randint(0, d_vocab, (n, half), generator=torch.Generator().manual_seed(seed))
    return torch.cat([seq, seq], 1)


def repeated_sequence_losses(model: Model, *, n: int = 64, half: int | None = None,
                             seed: int = 0) -> tuple[float, float]:
    """Loss on the first and on the second occurrence of ``n`` random token sequences of length
    ``half`` (default: half the context) repeated once: (first, repeat). Induction makes the repeat cheap."""
    half = model.cfg.n_ctx // 2 if half is None else half
    check_int_range("half", half, 2, model.cfg.n_ctx // 2)
    tokens = check_tokens(model, repeated_tokens(model.cfg.d_vocab, n=n, half=half, seed=seed))
    with torch.no_grad():
        per = model(tokens, return_type="loss", loss_per_token=True)  # (n, 2*half - 1): predicting token i+1
    return float(per[:, : half - 1].mean()), float(per[:, half:].mean())
