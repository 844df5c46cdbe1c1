"""Pre-LN vs post-LN gradients at initialisation (the table after Theorem 2).

Random stacks with ``d = 64``, four heads, a ReLU MLP of width 256, read out by a random linear
map through one final LayerNorm; root mean squares over draws. The pre-LN stack is a
TransformerLens ``Model`` fed the residual stream directly
(``start_at_layer=0``); the post-LN stack, which TransformerLens does not offer, is
:class:`PostLNStack`, reusing the very same attention and MLP modules so the two differ only in
where LayerNorm sits.

>>> row = gradient_scaling(depths=(2,), n_draws=1)[0]
>>> row.depth, row.pre_ln_last > 0
(2, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from .. import _names as N
from .._backend import Model, attention_output, make_config, mlp_out_parameter, reinitialise, set_unembedding
from ..models.checkpoints import build_model
from .geometry import layer_norm

__all__ = ["GradientRow", "gradient_scaling", "PostLNStack", "pre_ln_stack"]


def pre_ln_stack(depth: int, *, seed: int, d_model: int = 64, n_heads: int = 4, d_mlp: int = 256,
                 n_ctx: int = 16, d_out: int = 8, dtype: torch.dtype = torch.float64) -> Model:
    """A randomly initialised pre-LN stack (TransformerLens's GPT-2-style initialisation)."""
    cfg = make_config(n_layers=depth, d_model=d_model, n_heads=n_heads, d_head=d_model // n_heads,
                                  d_mlp=d_mlp, act_fn="relu", normalization_type="LN", d_vocab=d_out, n_ctx=n_ctx,
                                  attention_dir="bidirectional", positional_embedding_type="standard",
                                  dtype=dtype, seed=None, device="cpu")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_model(cfg)


class PostLNStack(nn.Module):
    """``x <- LN(x + MHA(x))``, ``x <- LN(x + MLP(x))`` over the blocks of a ``Model``.

    Uses the model's attention and MLP modules (and its ``W_U``) with LayerNorm of gain 1, bias 0:
    the post-LN arrangement of the same weights. The readout is ``LN(x_L) W_U``.
    """

    def __init__(self, model: Model):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for l, block in enumerate(self.model.blocks):
            x = layer_norm(x + attention_output(self.model, l, x))
            x = layer_norm(x + block.mlp(x))
        self.final_stream = x
        return layer_norm(x) @ self.model.W_U


@dataclass(frozen=True)
class GradientRow:
    """Root mean squares over draws at one depth."""

    depth: int
    pre_ln_last: float  # ||dL/dW_2||_F of the last block's MLP output weights, pre-LN
    post_ln_last: float
    pre_ln_first: float  # the first block's, pre-LN
    pre_ln_stream_norm: float  # ||x_L|| per token, pre-LN
    post_ln_stream_norm: float


def _rms(xs: list[float]) -> float:
    return float(torch.tensor(xs).pow(2).mean().sqrt())


def gradient_scaling(depths: Sequence[int] = (6, 12, 24), *, n_draws: int = 8, seed: int = 0,
                     n_tokens: int = 16) -> list[GradientRow]:
    """Measure the table: per depth, RMS over ``n_draws`` random stacks and inputs (float64).

    The loss is ``mean over tokens of sum_k (LN(x_L) W_U)_k c_k`` with a random readout ``W_U``
    (TransformerLens's initialisation) and ``c`` standard normal.
    """
    rows = []
    for depth in depths:
        acc: dict[str, list[float]] = {k: [] for k in ("pre_last", "post_last", "pre_first", "pre_norm", "post_norm")}
        model = pre_ln_stack(depth, seed=seed + 1000 * depth, n_ctx=n_tokens)
        for draw in range(n_draws):
            # the weights pre_ln_stack(depth, seed=seed + 1000 * depth + draw) would have, without building it again
            if draw:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(seed + 1000 * depth + draw)
                    reinitialise(model)
            # Common random numbers: draw k has the same input and readout at every depth, so the
            # depth trend is not buried under draw-to-draw noise.
            g = torch.Generator().manual_seed(seed + draw)
            x0 = torch.randn(1, n_tokens, model.cfg.d_model, generator=g, dtype=torch.float64)
            c = torch.randn(model.cfg.d_vocab, generator=g, dtype=torch.float64)
            set_unembedding(model,
                            torch.randn(model.W_U.shape, generator=g,
                                        dtype=torch.float64) * model.cfg.initializer_range)
            W_last, W_first = mlp_out_parameter(model, depth - 1), mlp_out_parameter(model, 0)

            box = {}
            with model.hooks(fwd_hooks=[(N.resid_post(depth - 1), lambda t, hook: box.__setitem__("x", t.detach()))]):
                out = model(x0, start_at_layer=0)
            loss = (out @ c).mean()
            g_last, g_first = torch.autograd.grad(loss, [W_last, W_first])
            acc["pre_last"].append(float(g_last.norm()))
            acc["pre_first"].append(float(g_first.norm()))
            acc["pre_norm"].append(float(box["x"].norm(dim=-1).pow(2).mean().sqrt()))

            post = PostLNStack(model)
            loss = (post(x0) @ c).mean()
            (g_post,) = torch.autograd.grad(loss, [W_last])
            acc["post_last"].append(float(g_post.norm()))
            acc["post_norm"].append(float(post.final_stream.detach().norm(dim=-1).pow(2).mean().sqrt()))
        rows.append(GradientRow(depth=depth, pre_ln_last=_rms(acc["pre_last"]), post_ln_last=_rms(acc["post_last"]),
                                pre_ln_first=_rms(acc["pre_first"]), pre_ln_stream_norm=_rms(acc["pre_norm"]),
                                post_ln_stream_norm=_rms(acc["post_norm"])))
    return rows
