"""Training the toy models with Adam, and scoring them on the induction task.

Reproducibility, stated as it holds:

- **On one machine** training is bit-for-bit deterministic for a given seed, within a process and
  across processes: the initialisation draws from a forked global RNG seeded with ``seed``, every
  batch from a ``torch.Generator`` seeded with ``seed + 1``, and the steps run on one intra-op
  thread. (With two threads, CPU reductions split work differently from run to run and the
  weights drift apart in the last bits within a few hundred steps.)
- **Across machines** it is not: float32 kernels round differently per CPU capability (AVX2,
  AVX512, the generic path), and 1000 Adam steps carry the last-bit difference into every
  weight. What holds is that the retrained model's test metrics sit within
  the tolerance recorded in :data:`rs_interp.models.registry.SHIPPED_MODELS` (see there for the
  measured spread).

>>> model = train_induction_model(1, steps=5, progress=False)
>>> held_out = induction_batch(64, seed=123)
>>> score = score_model(model, held_out.tokens, targets=held_out.targets)
>>> score.loss > 3.0
True
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int

from .._backend import Model, bias_parameters
from .._format import short
from .._keywords import renamed
from .._lazy import attach
from .._progress import bar
from .._state import preserve_state
from ..exact.readout import d_vocab_out
from ..exact.validate import check_int_range, check_targets, check_tokens
from .checkpoints import make_attn_only
from .data import induction_batch

__all__ = [
    "Score",
    "score_model",
    "train_induction_model",
    "train_on_batches",
    "trainable_parameters",
    "masked_next_token_loss",
    "score_logits",
]

#: The default Adam learning rate of the toy models.
DEFAULT_LR = 1e-2

# Biases the theory's model does not have: kept at zero, never trained.
_FROZEN_BIASES = ("b_V", "b_O", "b_U")


@dataclass(frozen=True)
class Score:
    """Mean next-token loss (nats) and accuracy over the scored positions.

    Attributes:
        loss: mean cross-entropy (nats) at the scored positions.
        accuracy: the fraction of scored positions whose argmax is the next token.
        n_scored: how many positions were scored.

    >>> from rs_interp import load_toy_model
    >>> batch = induction_batch(50, seed=1)
    >>> s = score_model(load_toy_model("induction-2l"), batch.tokens, targets=batch.targets)
    >>> s.loss < 0.3, s.accuracy > 0.9, s.n_scored == int((batch.targets >= 0).sum())
    (True, True, True)
    """

    loss: float
    accuracy: float
    n_scored: int

    def __repr__(self) -> str:  # 4 significant digits: what a notebook shows
        return f"Score(loss={short(self.loss)}, accuracy={short(self.accuracy)}, n_scored={self.n_scored})"


def trainable_parameters(model: Model, frozen: tuple[str, ...] = _FROZEN_BIASES) -> list[torch.nn.Parameter]:
    """Every parameter except the biases named in ``frozen``, which stay at zero (by default the value,
    output and unembedding biases the theory's model does not have)."""
    ids = {id(p) for p in bias_parameters(model, frozen)}
    return [p for p in model.parameters() if id(p) not in ids]


def masked_next_token_loss(
    logits: Float[torch.Tensor, "batch pos d_vocab"],
    tokens: Int[torch.Tensor, "batch pos"],
    mask: Bool[torch.Tensor, "batch pos_minus_1"],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy and number of correct argmax predictions over the masked positions."""
    logits, targets = _masked(logits, tokens, mask)
    loss = F.cross_entropy(logits.float(), targets)
    correct = (logits.argmax(-1) == targets).sum()
    return loss, correct


def _masked(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits and next tokens at the masked positions, in row-major order. A full mask (every
    position scored, as in code-2l's training) takes views: the same rows in the same order without
    the boolean index's copy and, in training, its backward's scatter."""
    if bool(mask.all()):
        return logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)
    return logits[:, :-1][mask], tokens[:, 1:][mask]


def _scored(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Summed cross-entropy, correct argmax predictions and their number at the positions with a target."""
    keep = targets >= 0
    n = int(keep.sum())
    picked, wanted = logits[keep].float() if logits.dtype != torch.float64 else logits[keep], targets[keep]
    return F.cross_entropy(picked, wanted, reduction="sum"), (picked.argmax(-1) == wanted).sum(), n


def score_logits(logits: Float[torch.Tensor, "batch pos d_vocab"], targets: Int[torch.Tensor, "batch pos"]) -> Score:
    """Loss and accuracy of precomputed ``logits`` (e.g. from an ablation run) at the positions with a
    target (``targets``: token ids, -1 = skip; an induction batch's ``targets``).

    Raises:
        ValueError: ``targets`` not of the logits' (batch, pos), or no position with a target.

    >>> from rs_interp import load_toy_model, run_with_key_input
    >>> model, batch = load_toy_model("induction-2l"), induction_batch(50, seed=1)
    >>> score_logits(model(batch.tokens), batch.targets) == score_model(model, batch.tokens, targets=batch.targets)
    True
    >>> keys_from_x0 = run_with_key_input(model, batch.tokens, layer=1)  # layer 1's keys from x_0 alone
    >>> score_logits(keys_from_x0, batch.targets).accuracy < 0.2
    True
    """
    targets = check_targets(targets, logits[..., 0], logits.shape[-1])
    loss, correct, n = _scored(logits.detach(), targets.to(logits.device))
    if n == 0:
        raise ValueError("targets has no position to score (every entry is -1)")
    return Score(loss=float(loss) / n, accuracy=int(correct) / n, n_scored=n)


@renamed(chunk_size="batch_chunk")
def score_model(model: Model, tokens: Int[torch.Tensor, "batch pos"], *, targets: Int[torch.Tensor, "batch pos"],
                batch_chunk: int = 250) -> Score:
    """Loss and accuracy of ``model`` on ``tokens`` at the positions with a target (``targets``: the
    next token, -1 = skip; an induction batch's ``targets`` scores the second period): the
    :class:`Score` of the model's own logits, ``score_logits(model(tokens), targets)`` run
    ``batch_chunk`` sequences at a time. (Named ``evaluate`` before issue 51; that name, beside
    ``evaluate_circuit``, said neither what is computed nor of what; it still works, with a warning.)

    ``batch_chunk``: sequences per forward pass (as :func:`rs_interp.logit_lens`'s).

    Uniform guessing costs ``ln 256 = 5.545`` nats.

    >>> batch = induction_batch(8, seed=0)
    >>> score_model(make_attn_only(1), batch.tokens, targets=batch.targets).loss > 5.0
    True
    """
    check_int_range("batch_chunk", batch_chunk, 1)
    tokens = check_tokens(model, tokens)
    targets = check_targets(targets, tokens, d_vocab_out(model))
    total_loss, total_correct, n = 0.0, 0, 0
    with preserve_state(model), torch.no_grad():
        for start in range(0, tokens.shape[0], batch_chunk):
            logits = model(tokens[start : start + batch_chunk], return_type="logits")
            loss, correct, k = _scored(logits, targets[start : start + batch_chunk])
            total_loss, total_correct, n = total_loss + float(loss), total_correct + int(correct), n + k
    if n == 0:
        raise ValueError("targets has no position to score (every entry is -1)")
    return Score(loss=total_loss / n, accuracy=total_correct / n, n_scored=n)


def train_on_batches(
    model: Model,
    batches: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    *,
    steps: int,
    lr: float,
    progress: bool = True,
    desc: str = "training",
    params: list[torch.nn.Parameter] | None = None,
    warmup: int = 0,
) -> list[float]:
    """Train ``model`` in place with Adam for ``steps`` steps; ``batches(step)`` gives ``(tokens, mask)``.

    Updates ``params`` (default: :func:`trainable_parameters`, the toy models' set); the learning
    rate rises linearly over the first ``warmup`` steps (``lr * (step + 1) / warmup``). Returns the
    loss per step.
    """
    check_int_range("steps", steps, 0)
    check_int_range("warmup", warmup, 0)
    if not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be a positive finite float, got {lr}")
    opt = torch.optim.Adam(trainable_parameters(model) if params is None else params, lr=lr)
    # LambdaLR sets lr = lr * factor(0) at construction: with no warmup the factor is 1 throughout.
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
    losses: list[float] = []
    model.train()
    bar_: Iterator[int] = bar(range(steps), desc=desc, enabled=progress)
    with _one_thread():
        for step in bar_:
            tokens, mask = batches(step)
            # The loss alone: the argmax of the scoring would cost a pass over every logit per step.
            logits, targets = _masked(model(tokens, return_type="logits"), tokens, mask)
            loss = F.cross_entropy(logits.float(), targets)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
            if progress and step % 50 == 0:
                bar_.set_postfix(loss=f"{losses[-1]:.3f}")
    model.eval()
    return losses


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def train_induction_model(
    n_layers: int,
    *,
    steps: int = 1000,
    batch_size: int = 64,
    lr: float = DEFAULT_LR,
    seed: int = 0,
    progress: bool = True,
) -> Model:
    """Train a toy attention-only model on fresh repeated random sequences.

    Adam on the loss at scored positions (``i >= p``), a fresh batch every step. With the
    defaults the two-layer model forms an induction circuit (loss ~0.1-0.3 nats) and the
    one-layer model cannot (loss > 3.5).

    Raises:
        ValueError: ``n_layers < 1``, ``steps < 0``, ``batch_size < 1`` or a non-positive ``lr``.

    >>> model = train_induction_model(1, steps=5, batch_size=8, progress=False)  # the real recipe: 1000 steps
    >>> b = induction_batch(8, seed=9)
    >>> model.cfg.n_layers, score_model(model, b.tokens, targets=b.targets).loss < 6.0
    (1, True)
    """
    check_int_range("n_layers", n_layers, 1)
    check_int_range("batch_size", batch_size, 1)
    model = make_attn_only(n_layers, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)

    def batches(_: int) -> tuple[torch.Tensor, torch.Tensor]:
        b = induction_batch(batch_size, generator=gen, d_vocab=model.cfg.d_vocab, seq_len=model.cfg.n_ctx)
        return b.tokens, b.scored

    train_on_batches(model, batches, steps=steps, lr=lr, progress=progress,
                     desc=f"training {n_layers}-layer induction model")
    return model


#: The old name, kept for a release: ``rs_interp.models.training.evaluate`` warns and gives :func:`score_model`.
__getattr__, _ = attach(__name__, {}, globals(), deprecated={"evaluate": (f"{__name__}.score_model", FutureWarning)})
