"""Training transcoders on a model's own activations, and the measures of how well they replace its MLPs.

For each layer, pairs ``(x, y)`` of MLP input and MLP output are collected over ``tokens`` and a
transcoder is fit to them with Adam, minimising

    ||y - y_hat||^2 / var(y)  +  l1 * sum_i a_i ||W_dec[i]||        (ReLU; TopK: the first term only)

the first term the fraction of variance unexplained (FVU) of the batch, the second the decoder-norm
weighted L1 penalty of Anthropic's transcoders. Measures (:func:`transcoder_metrics`), on tokens the
transcoders were not trained on: per layer the FVU, the mean number of active features per token
(L0) and the fraction of features never active (dead); and the **replacement model's KL**, the mean
per-token ``KL(model || replacement)`` of the next-token distributions when every MLP is replaced by
its transcoder at once (each reading the replacement's own stream).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from jaxtyping import Int

from .. import _names as N
from .._backend import Model
from .._progress import bar
from .._state import outside_inference_mode
from ..exact.needs import MLP_IO, needs
from . import _replacement as R
from .transcoders import Transcoder, TranscoderSet

__all__ = ["TranscoderMetrics", "TrainedTranscoders", "train_transcoder", "transcoder_metrics"]


@dataclass(frozen=True)
class TranscoderMetrics:
    """How well a transcoder set replaces a model's MLPs (module docstring).

    Attributes:
        fvu, l0, dead: per layer.
        kl: mean per-token KL(model || replacement model), nats.
        loss, replacement_loss: the mean next-token loss of the model and of the replacement model (None
            when the model's outputs are not its input vocabulary, as tracr's).
        n_tokens: tokens measured on.

    >>> TranscoderMetrics((0.1,), (8.0,), (0.0,), 0.2, 2.0, 2.1, 64).as_dict()["dead_fraction"]
    [0.0]
    """

    fvu: tuple[float, ...]
    l0: tuple[float, ...]
    dead: tuple[float, ...]
    kl: float
    loss: float | None
    replacement_loss: float | None
    n_tokens: int

    def as_dict(self) -> dict:
        return {"fvu": list(self.fvu), "l0": list(self.l0), "dead_fraction": list(self.dead), "kl": self.kl,
                "loss": self.loss, "replacement_loss": self.replacement_loss, "n_tokens": self.n_tokens}


@dataclass(frozen=True)
class TrainedTranscoders:
    """A trained set, its measures on held-out tokens, and each layer's training curve (its FVU every
    ``steps // 100`` steps): what :func:`train_transcoder` returns (see its example).

    >>> metrics = TranscoderMetrics((1.0,), (0.0,), (1.0,), 0.0, None, None, 0)
    >>> t = TrainedTranscoders(TranscoderSet((Transcoder(4, 8),)), metrics, ((1.0,),))
    >>> len(t.transcoders), t.curves[0]
    (1, (1.0,))
    """

    transcoders: TranscoderSet
    metrics: TranscoderMetrics
    curves: tuple[tuple[float, ...], ...]


@dataclass(frozen=True)
class Recipe:
    """How transcoders are trained (:func:`train_transcoder`'s and :func:`~rs_interp.features.train_clt`'s
    arguments of the same names), as one value checked when made.

    Raises:
        ValueError: an activation other than ``"relu"`` or ``"topk"``, or a size below 1.
    """

    d_transcoder: int
    activation: str = "relu"
    k: int | None = None
    l1: float = 1e-3
    steps: int = 2000
    batch_size: int = 1024
    lr: float = 1e-3
    seed: int = 0
    skip: bool = False

    def __post_init__(self) -> None:
        if self.activation not in ("relu", "topk"):
            raise ValueError(f"rs_interp trains relu and topk transcoders, not {self.activation!r} (JumpReLU "
                             "needs a straight-through estimator for its thresholds: train elsewhere and "
                             "load_transcoders)")
        if self.d_transcoder < 1 or self.steps < 1 or self.batch_size < 1:
            raise ValueError("d_transcoder, steps and batch_size must be >= 1")


def _pairs(model: Model, transcoders_like: TranscoderSet, tokens: torch.Tensor, chunk: int = 64):
    """Per layer, (MLP inputs, MLP outputs) over every token, each (n_tokens, d_model), in float32."""
    xs = [[] for _ in range(model.cfg.n_layers)]
    ys = [[] for _ in range(model.cfg.n_layers)]
    hooks = []
    for l in range(model.cfg.n_layers):
        hooks.append((R.input_hook(model, transcoders_like, l), lambda t, hook, l=l: xs[l].append(
            R.finish_input(model, transcoders_like, l, t).flatten(0, 1).float())))
        hooks.append((N.mlp_out(l), lambda t, hook, l=l: ys[l].append(t.flatten(0, 1).float())))
    with R.quiet_model(model), torch.no_grad(), model.hooks(fwd_hooks=hooks):
        for start in range(0, len(tokens), chunk):
            model(tokens[start : start + chunk], return_type="logits")
    return [torch.cat(x) for x in xs], [torch.cat(y) for y in ys]


@needs(*MLP_IO, name="features.train_transcoder", refuses=("attention-only",))
@outside_inference_mode
def train_transcoder(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    *,
    d_transcoder: int,
    activation: str = "relu",
    k: int | None = None,
    l1: float = 1e-3,
    skip: bool = False,
    steps: int = 2000,
    batch_size: int = 1024,
    lr: float = 1e-3,
    seed: int = 0,
    eval_tokens: Int[torch.Tensor, "batch pos"] | None = None,
    input_point: str = "mlp.hook_in",
    progress: bool = True,
) -> TrainedTranscoders:
    """Train one transcoder per layer on the model's MLP inputs and outputs over ``tokens`` (module docstring).

    Args:
        d_transcoder: features per layer.
        activation: ``"relu"`` (with the ``l1`` penalty) or ``"topk"`` (with ``k``).
        skip: give each transcoder a linear skip connection.
        steps, batch_size, lr: Adam steps over random batches of ``batch_size`` tokens, at learning rate ``lr``
            (cosine-decayed to a tenth).
        seed: seeds the initialisation and the batches (one thread for reproducibility, as elsewhere).
        eval_tokens: where the metrics are measured (default: ``tokens``, which flatters them).

    Raises:
        ValueError: JumpReLU (trained with a straight-through estimator rs_interp does not implement: load
            one instead), a bad size, or a model the replacement cannot run
            (:func:`rs_interp.features.attribution_graph`).

    >>> import torch
    >>> from rs_interp import load_toy_model
    >>> model = load_toy_model("code-2l")
    >>> toks = torch.randint(0, 2048, (8, 64), generator=torch.Generator().manual_seed(0))
    >>> t = train_transcoder(model, toks, d_transcoder=256, activation="topk", k=16, steps=20)
    >>> len(t.transcoders), t.metrics.l0[0] <= 16
    (2, True)
    """
    recipe = Recipe(d_transcoder, activation, k, l1, steps, batch_size, lr, seed, skip)
    L, d = model.cfg.n_layers, model.cfg.d_model
    probe = TranscoderSet(tuple(Transcoder(d, 1) for _ in range(L)), input_point=input_point)
    R.check_replacement(model, probe, "features.train_transcoder")
    # training needs autograd, whatever the caller's mode: the decorator leaves inference mode, inputs copied out of it
    xs, ys = _pairs(model, probe, torch.as_tensor(tokens).long())
    tcs, curves = _train(xs, ys, recipe, progress)
    tset = TranscoderSet(tuple(tcs), input_point=input_point)
    metrics = transcoder_metrics(model, tset, tokens if eval_tokens is None else eval_tokens)
    return TrainedTranscoders(tset, metrics, tuple(tuple(c) for c in curves))


def _train(xs: list[torch.Tensor], ys: list[torch.Tensor], recipe: Recipe,
           progress: bool) -> tuple[list[Transcoder], list[list[float]]]:
    """Adam on every layer's transcoder at once (module docstring); the transcoders and their curves."""
    r, L, d, n = recipe, len(xs), xs[0].shape[-1], len(xs[0])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(r.seed)
        tcs = [_init(Transcoder(d, r.d_transcoder, activation=r.activation, k=r.k, skip=r.skip), ys[l])
               for l in range(L)]
    params = [p for tc in tcs for p in tc.parameters()]
    opt = torch.optim.Adam(params, lr=r.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.1 + 0.45 * (1 + math.cos(math.pi * s / r.steps)))
    var = [y.var(0).sum() for y in ys]
    gen = torch.Generator().manual_seed(r.seed + 1)
    curves: list[list[float]] = [[] for _ in range(L)]
    with torch.enable_grad():
        for step in bar(range(r.steps), desc="transcoders", enabled=progress, unit="step"):
            idx = torch.randint(0, n, (min(r.batch_size, n),), generator=gen)
            total = 0.0
            for l, tc in enumerate(tcs):
                x, y = xs[l][idx], ys[l][idx]
                acts = tc.encode(x)
                fvu = (tc.decode(acts, x) - y).pow(2).sum(-1).mean() / var[l]
                loss = fvu + (r.l1 * (acts * tc.W_dec.norm(dim=-1)).sum(-1).mean() if r.activation == "relu" else 0.0)
                total = total + loss
                if step % max(1, r.steps // 100) == 0:
                    curves[l].append(float(fvu.detach()))
            opt.zero_grad()
            total.backward()
            opt.step()
            sched.step()
    for tc in tcs:
        tc.requires_grad_(False)
    return tcs, curves


def _init(tc: Transcoder, y: torch.Tensor) -> Transcoder:
    """Unit-norm random decoder rows, the encoder their transpose's scale, ``b_dec`` the mean output."""
    with torch.no_grad():
        W = torch.randn_like(tc.W_dec)
        tc.W_dec.copy_(0.1 * W / W.norm(dim=-1, keepdim=True))
        E = torch.randn_like(tc.W_enc)
        tc.W_enc.copy_(E / E.norm(dim=-1, keepdim=True))
        tc.b_dec.copy_(y.mean(0))
    return tc


@needs(*MLP_IO, name="features.transcoder_metrics", refuses=("attention-only",))
def transcoder_metrics(model: Model, transcoders: TranscoderSet,
                       tokens: Int[torch.Tensor, "batch pos"]) -> TranscoderMetrics:
    """FVU, L0, dead fraction per layer and the replacement model's KL and loss over ``tokens`` (module docstring).

    >>> import torch
    >>> from rs_interp import load_toy_model
    >>> from rs_interp.features import mlp_transcoders
    >>> model = load_toy_model("tracr-sort")
    >>> m = transcoder_metrics(model, mlp_transcoders(model), torch.tensor([[0, 3, 1, 2, 4]]))
    >>> max(m.fvu) < 1e-10, m.kl < 1e-10
    (True, True)
    """
    tokens = torch.as_tensor(tokens).long()
    R.check_replacement(model, transcoders, "features.transcoder_metrics")
    tcs = transcoders if transcoders.dtype == torch.float32 else transcoders.to(torch.float32)
    xs, ys = _pairs(model, tcs, tokens)
    fvu, l0, dead = [], [], []
    with torch.no_grad():
        for l, tc in enumerate(tcs):
            acts = tc.encode(xs[l])
            err = (tc.decode(acts, xs[l]) - ys[l]).pow(2).sum()
            fvu.append(float(err / (ys[l] - ys[l].mean(0)).pow(2).sum().clamp(min=1e-30)))
            l0.append(float((acts != 0).sum(-1).float().mean()))
            dead.append(float(((acts != 0).sum(0) == 0).float().mean()))
    box: dict[int, torch.Tensor] = {}
    hooks = []
    for l in range(model.cfg.n_layers):
        hooks.append((R.input_hook(model, tcs, l),
                      lambda t, hook, l=l: box.__setitem__(l, R.finish_input(model, tcs, l, t))))
        hooks.append((N.mlp_out(l), lambda t, hook, l=l: tcs[l](box[l].float()).to(t.dtype)))
    with R.quiet_model(model), torch.no_grad():
        logits = model(tokens, return_type="logits").double()
        with model.hooks(fwd_hooks=hooks):
            replaced = model(tokens, return_type="logits").double()
    logp, logq = logits.log_softmax(-1), replaced.log_softmax(-1)
    kl = float((logp.exp() * (logp - logq)).sum(-1).mean())
    lm = logits.shape[-1] == model.cfg.d_vocab  # outputs over the input vocabulary: a next-token loss exists
    nll = lambda lp: float(-lp[:, :-1].gather(-1, tokens[:, 1:, None]).mean()) if lm else None  # noqa: E731
    return TranscoderMetrics(tuple(fvu), tuple(l0), tuple(dead), kl, nll(logp), nll(logq), int(tokens.numel()))
