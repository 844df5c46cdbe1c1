"""The tuned lens: a learned affine translator per reading point, then the model's own readout.

The logit lens decodes the stream ``x_l`` after layer ``l`` as if it were the last one. The tuned
lens (Belrose et al. 2023) first maps it by an affine translator trained for that point,

    ``lens_l(x) = readout(x + x A_l + b_l)``,   ``readout(x) = LN_final(x) W_U + b_U``,

with ``A_l, b_l`` initialised at zero (the logit lens) and trained to minimise the KL divergence
from the model's final distribution, ``KL(p_final || softmax(lens_l(x_l)))``, averaged over tokens.
The model itself is never changed. The ``tuned-lens`` package does this for Hugging Face models;
this module does it for any model rs_interp reads (TransformerLens 3.x or 4.x), with the final
point left out (it is the output). Translators save as safetensors + JSON.

>>> import rs_interp as ri
>>> model = ri.load_toy_model("induction-2l")
>>> toks = ri.induction_batch(16, seed=3).tokens
>>> tuned = train_tuned_lens(model, toks, steps=5, progress=False)
>>> tuned.labels, tuple(lens_kl(model, toks, tuned).shape)
(('embed', 'L0'), (2,))
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from jaxtyping import Float, Int
from safetensors.torch import save_file

from .._backend import Model
from .._files import check_shape, need, parsing, read_json, read_safetensors
from .._progress import bar
from .._state import preserve_state
from ..exact.certificate import require
from ..exact.needs import needs
from ..exact.readout import compute_dtype, readout
from ..exact.validate import check_int_range, check_tokens
from ..hooks import store
from .lens import reading_points

__all__ = ["TunedLens", "train_tuned_lens", "lens_kl"]


@dataclass(frozen=True)
class TunedLens:
    """One affine translator per reading point before the last.

    Attributes:
        labels: the reading points (``"embed"``, ``"L0"``, ...), as :func:`rs_interp.logit_lens` names them.
        weight: (point, d_model, d_model) ``A_l``; the translator is ``x + x A_l + b_l``.
        bias: (point, d_model) ``b_l``.
        metadata: how it was trained (steps, lr, tokens, seed, final KL per point).

    >>> import tempfile
    >>> from rs_interp.models import SHIPPED_MODELS
    >>> model = SHIPPED_MODELS["code-2l"].load()
    >>> tokens = torch.randint(0, 2048, (4, 64), generator=torch.Generator().manual_seed(0))
    >>> tuned = train_tuned_lens(model, tokens, steps=2, progress=False)
    >>> tuned.labels, tuple(tuned.weight.shape)  # every reading point but the last; (point, d_model, d_model)
    (('embed', 'L0'), (2, 128, 128))
    >>> TunedLens.load(tuned.save(tempfile.mkdtemp() + "/lens")).labels == tuned.labels
    True
    """

    labels: tuple[str, ...]
    weight: Float[torch.Tensor, "point d_model d_model"]
    bias: Float[torch.Tensor, "point d_model"]
    metadata: dict

    def translate(self, point: int, x: Float[torch.Tensor, "... d_model"]) -> Float[torch.Tensor, "... d_model"]:
        return x + x @ self.weight[point].to(x.dtype) + self.bias[point].to(x.dtype)

    def save(self, path: str | Path) -> Path:
        """Write ``path.safetensors`` (weights) and ``path.json`` (labels, metadata)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({"weight": self.weight.contiguous(), "bias": self.bias.contiguous()},
                  str(path.with_suffix(".safetensors")))
        path.with_suffix(".json").write_text(json.dumps({"labels": list(self.labels), "metadata": self.metadata},
                                                        indent=2))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "TunedLens":
        """Read ``path.safetensors`` and ``path.json`` as :meth:`save` writes them.

        Raises:
            rs_interp.FileError: a file missing, truncated or malformed, a tensor missing or of the wrong shape
                (``weight`` (point, d_model, d_model), ``bias`` (point, d_model), one point per label); the file named.
        """
        path = Path(path)
        weights, record = path.with_suffix(".safetensors"), path.with_suffix(".json")
        meta = read_json(record, "tuned-lens record")
        need(meta, ("labels", "metadata"), record, "tuned-lens record")
        tensors = read_safetensors(weights, "tuned-lens weights")
        need(tensors, ("weight", "bias"), weights, "tuned-lens weights")
        with parsing(record, "tuned-lens record"):
            labels = tuple(str(label) for label in meta["labels"])
        d = tensors["bias"].shape[-1] if tensors["bias"].ndim else 0
        check_shape(tensors["weight"], (len(labels), d, d), "weight", weights, "tuned-lens weights")
        check_shape(tensors["bias"], (len(labels), d), "bias", weights, "tuned-lens weights")
        return cls(labels, tensors["weight"], tensors["bias"], meta["metadata"])


def _streams(model: Model, tokens: torch.Tensor) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """Every reading point's stream (point, rows, d_model) and the final log-probabilities (rows, d_vocab)."""
    points = reading_points(model)
    box: dict[str, torch.Tensor] = {}
    with preserve_state(model), torch.no_grad(), model.hooks(fwd_hooks=[(n, store(box, n)) for _, n in points]):
        logits = model(tokens, return_type="logits")
    d, dt = model.cfg.d_model, compute_dtype(model)
    streams = torch.stack([box[n].reshape(-1, d).to(dt) for _, n in points])
    return [label for label, _ in points], streams, logits.reshape(-1, logits.shape[-1]).to(dt).log_softmax(-1)


def _readout(model: Model, x: torch.Tensor) -> torch.Tensor:
    """The model's readout of ``x`` (the final norm, ``W_U``, ``b_U`` and the soft-cap: the logit lens's)."""
    return readout(model, x, x.dtype)


def _kl(final_lp: torch.Tensor, lens_logits: torch.Tensor) -> torch.Tensor:
    """Mean over rows of KL(p_final || softmax(lens_logits))."""
    lens_lp = lens_logits.log_softmax(-1)
    return (final_lp.exp() * (final_lp - lens_lp)).sum(-1).mean()


@needs("readout", "vocabulary")
def train_tuned_lens(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    *,
    steps: int = 500,
    lr: float = 1e-3,
    batch_rows: int = 512,
    seed: int = 0,
    progress: bool = True,
) -> TunedLens:
    """Train one translator per reading point (all but the last) on the streams of ``tokens``.

    Adam on ``KL(p_final || lens)``, ``batch_rows`` token positions per step drawn with a seeded
    generator; the model's parameters get no gradient. In the model's dtype (float32 for half precision).

    >>> from rs_interp.models import SHIPPED_MODELS
    >>> model = SHIPPED_MODELS["code-2l"].load()
    >>> tokens = torch.randint(0, model.cfg.d_vocab, (4, 64), generator=torch.Generator().manual_seed(0))
    >>> tuned = train_tuned_lens(model, tokens, steps=10, progress=False)
    >>> bool((lens_kl(model, tokens, tuned) < lens_kl(model, tokens)).all())  # closer to the final distribution
    True
    """
    tokens = check_tokens(model, tokens)
    require(model, "train_tuned_lens")
    check_int_range("steps", steps, 0)
    check_int_range("batch_rows", batch_rows, 1)
    labels, streams, final_lp = _streams(model, tokens)
    n_points, rows, d = streams.shape[0] - 1, streams.shape[1], streams.shape[2]
    weight = torch.zeros(n_points, d, d, dtype=streams.dtype, requires_grad=True)
    bias = torch.zeros(n_points, d, dtype=streams.dtype, requires_grad=True)
    opt = torch.optim.Adam([weight, bias], lr=lr)
    g = torch.Generator().manual_seed(seed)
    with preserve_state(model), torch.enable_grad():
        for _ in bar(range(steps), desc="tuned lens", enabled=progress):
            idx = torch.randint(0, rows, (min(batch_rows, rows),), generator=g)
            x = streams[:-1, idx]  # (point, rows, d)
            translated = x + torch.einsum("prd,pde->pre", x, weight) + bias[:, None]
            loss = torch.stack([_kl(final_lp[idx], _readout(model, translated[i])) for i in range(n_points)]).sum()
            # Gradients for the translators only: the model's parameters never get a .grad.
            weight.grad, bias.grad = torch.autograd.grad(loss, [weight, bias])
            opt.step()
    tuned = TunedLens(tuple(labels[:-1]), weight.detach(), bias.detach(), {"model": _fingerprint(model)})
    kl = lens_kl(model, tokens, tuned)
    meta = {"steps": steps, "lr": lr, "batch_rows": batch_rows, "seed": seed, "rows": rows, "train_kl": kl.tolist(),
            "model": _fingerprint(model)}
    return TunedLens(tuned.labels, tuned.weight, tuned.bias, meta)


def _fingerprint(model: Model) -> dict[str, float]:
    """The norms of the weights a lens depends on (float64): the same model in another dtype or
    TransformerLens version matches to ~1e-4; another model does not."""
    with torch.no_grad():
        norms = {"W_E": model.W_E, "W_U": model.W_U, **{f"W_O{l}": b.attn.W_O for l, b in enumerate(model.blocks)}}
        return {k: float(v.to(torch.float64).norm()) for k, v in norms.items()}


def _check_lens(model: Model, tuned: TunedLens, strict: bool) -> None:
    labels = tuple(label for label, _ in reading_points(model))[:-1]  # every reading point but the last
    if tuned.weight.shape[-1] != model.cfg.d_model or tuple(tuned.labels) != labels:
        raise ValueError(f"this tuned lens reads {tuned.labels} of width {tuned.weight.shape[-1]}; the model has "
                         f"{labels} of width {model.cfg.d_model}: it was trained on another model")
    recorded = tuned.metadata.get("model")
    if strict and recorded:
        mine = _fingerprint(model)
        off = [(k, v, mine.get(k)) for k, v in recorded.items()
               if mine.get(k) is None or abs(mine[k] - v) > 1e-3 * max(abs(v), 1e-12)]
        if off:
            name, theirs, ours = off[0]
            raise ValueError(f"this tuned lens was trained on another model (|{name}| {theirs:.6g} there, {ours} "
                             f"here); pass strict=False to apply it anyway")


@needs("readout", "vocabulary")
def lens_kl(model: Model, tokens: Int[torch.Tensor, "batch pos"], tuned: TunedLens | None = None, *,
            strict: bool = True) -> Float[torch.Tensor, " point"]:
    """``KL(p_final || lens)`` at every reading point but the last, mean over positions: the logit
    lens without ``tuned``, the tuned lens with it.

    Raises:
        ValueError: ``tuned`` has other reading points or width than the model, or (``strict``) was
            trained on another model (the norms of ``W_E``, ``W_U`` and every ``W_O`` it recorded
            differ by more than 1e-3 relative; a copy in another dtype or version passes).

    >>> from rs_interp.models import SHIPPED_MODELS
    >>> model = SHIPPED_MODELS["code-2l"].load()
    >>> kl = lens_kl(model, torch.randint(0, model.cfg.d_vocab, (4, 64), generator=torch.Generator().manual_seed(0)))
    >>> tuple(kl.shape), bool((kl >= 0).all())  # one KL per reading point but the last (embed, L0)
    ((2,), True)
    """
    tokens = check_tokens(model, tokens)
    require(model, "lens_kl")
    if tuned is not None:
        _check_lens(model, tuned, strict)
    _, streams, final_lp = _streams(model, tokens)
    out = []
    with torch.no_grad():
        for i in range(streams.shape[0] - 1):
            x = streams[i] if tuned is None else tuned.translate(i, streams[i])
            out.append(_kl(final_lp, _readout(model, x)))
    return torch.stack(out)
