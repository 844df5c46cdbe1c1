"""The one norm: every normalization TransformerLens builds, written once.

A norm ``N`` maps a stream vector ``x`` (d_model) to

    N(x) = gain * c(x) / s(x) + bias,     s(x) = sqrt(mean(c(x)^2) + eps),

where ``c`` centres (``x - mean(x)``: LayerNorm, ``"LN"``/``"LNPre"``) or is the identity (RMSNorm,
``"RMS"``/``"RMSPre"``); the ``Pre`` kinds have no gain and no bias. The gain is the one the model
applies (Gemma's ``1 + w`` where it stores an offset; none for OLMo's parameter-free LayerNorm): the
backend reads it (:func:`rs_interp._backend.norm_of`). With the scale ``s`` *frozen* (held at its
value in a run), ``N`` is affine in ``x``, which is how every exact decomposition in rs_interp reads a
norm; its transpose moves a read direction back through it (:meth:`Norm.readout`), and
:meth:`Norm.input_gradient` is its real (unfrozen) Jacobian transposed.

Every module that normalises by hand reads this one (the certificate's checks, the decompositions, the
edge methods, the circuits' ablated runs and TransformerLens 4's emulated per-head inputs). It needs torch
alone and sits below every package, :mod:`rs_interp._backend` (which builds a model's norms) included; users
import it as :mod:`rs_interp.exact.norm`.

>>> x = torch.randn(3, 8, dtype=torch.float64)
>>> norm = Norm("LN", torch.rand(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64), 1e-5)
>>> want = torch.nn.functional.layer_norm(x, (8,), norm.gain, norm.bias, eps=1e-5)
>>> bool(torch.allclose(norm.apply(x), want)), bool(torch.allclose(norm.apply(x, scale=norm.scale(x)), want))
(True, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["Norm", "KINDS", "IDENTITY"]

#: The normalizations TransformerLens offers (None: no norm); each has an exact split once its scale is frozen.
KINDS = ("LN", "LNPre", "RMS", "RMSPre", None)


@dataclass(frozen=True)
class Norm:
    """One norm as the model computes it (module docstring).

    Attributes:
        kind: ``"LN"``, ``"LNPre"``, ``"RMS"``, ``"RMSPre"`` or None (no norm: every method is the identity).
        gain: the gain it applies (d_model), or None.
        bias: its bias (d_model), or None.
        eps: its epsilon.
    """

    kind: str | None
    gain: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    eps: float = 0.0

    @property
    def centres(self) -> bool:
        return self.kind in ("LN", "LNPre")

    def to(self, dtype: torch.dtype) -> "Norm":
        """The same norm with its gain and bias detached, in ``dtype``."""
        cast = lambda t: None if t is None else t.detach().to(dtype)  # noqa: E731
        return Norm(self.kind, cast(self.gain), cast(self.bias), self.eps)

    def centre(self, x: torch.Tensor) -> torch.Tensor:
        """``c(x)``: ``x`` minus its mean for a LayerNorm, ``x`` itself for an RMSNorm."""
        return x - x.mean(-1, keepdim=True) if self.centres else x

    def scale(self, x: torch.Tensor) -> torch.Tensor:
        """``s(x)`` (..., 1); ones where there is no norm."""
        if self.kind is None:
            return torch.ones_like(x[..., :1])
        return (self.centre(x).pow(2).mean(-1, keepdim=True) + self.eps).sqrt()

    def affine(self, normalized: torch.Tensor) -> torch.Tensor:
        """The gain and bias applied to ``c(x) / s(x)`` (TransformerLens's ``hook_normalized``)."""
        out = normalized if self.gain is None else normalized * self.gain.to(normalized.dtype)
        return out if self.bias is None else out + self.bias.to(normalized.dtype)

    def linear(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """The frozen norm's linear part, ``gain * c(x) / scale`` (no bias): what a term of a sum writes."""
        if self.kind is None:
            return x
        out = self.centre(x) / scale.to(x.dtype)
        return out if self.gain is None else out * self.gain.to(x.dtype)

    def apply(self, x: torch.Tensor, *, scale: torch.Tensor | None = None) -> torch.Tensor:
        """``N(x)``, the scale ``s(x)`` unless a frozen ``scale`` is given."""
        if self.kind is None:
            return x
        return self.affine(self.centre(x) / (self.scale(x) if scale is None else scale.to(x.dtype)))

    def readout(self, direction: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """The vector ``g`` with ``linear(c, scale) . direction = c . g`` for every ``c``: the transpose
        of the frozen norm (centring is a symmetric projection), ``c(gain * direction) / scale``."""
        if self.kind is None:
            return direction
        g = direction if self.gain is None else direction * self.gain.to(direction.dtype)
        return self.centre(g) / scale.to(direction.dtype)

    def input_gradient(self, dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The gradient at the norm's input ``x`` (row, d_model) given the gradient ``dy`` at its output
        (any leading axes ending in (row, d_model), e.g. one per head), the statistics those of ``x``:
        ``(g - n mean(g n) - mean(g)) / s`` with ``g = gain * dy``, ``n = c(x) / s`` (no ``mean(g)`` for RMS).

        >>> x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
        >>> dy = torch.randn(1, 3, 8, dtype=torch.float64)
        >>> y = torch.nn.functional.layer_norm(x, (8,), eps=1e-5)
        >>> (auto,) = torch.autograd.grad(y, x, dy[0])
        >>> bool(torch.allclose(Norm("LNPre", eps=1e-5).input_gradient(dy, x.detach())[0], auto))
        True
        """
        if self.kind is None:
            return dy
        g = dy if self.gain is None else dy * self.gain.to(dy.dtype)
        c = self.centre(x)
        s = (c.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()
        n = c / s
        dx = g - n * (g * n).mean(-1, keepdim=True)
        if self.centres:
            dx = dx - g.mean(-1, keepdim=True)
        return dx / s

    def jvp(self, v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The norm's real (unfrozen) Jacobian at ``x`` applied to a change ``v`` (both (..., d_model)):
        ``gain * (c(v) - n mean(n c(v))) / s`` with ``n = c(x) / s``, the first-order change of ``N(x + v)``.

        >>> x, v = torch.randn(3, 8, dtype=torch.float64), torch.randn(3, 8, dtype=torch.float64)
        >>> norm = Norm("RMS", torch.rand(8, dtype=torch.float64), None, 1e-6)
        >>> _, auto = torch.func.jvp(norm.apply, (x,), (v,))
        >>> bool(torch.allclose(norm.jvp(v, x), auto))
        True
        """
        if self.kind is None:
            return v
        c = self.centre(x)
        s = (c.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()
        n = c / s
        cv = self.centre(v)
        dy = (cv - n * (n * cv).mean(-1, keepdim=True)) / s
        return dy if self.gain is None else dy * self.gain.to(dy.dtype)

    def through_projection(self, W: torch.Tensor) -> Callable[..., torch.Tensor]:
        """:meth:`input_gradient` behind a per-head projection ``y_h = N(x) W_h`` (``W``: (head, d_model,
        d_head)), fused: the returned ``f(grad, x, out=None)`` maps the gradient at ``y`` (head, row,
        d_head) and the input ``x`` (row, d_model) to the gradient at each head's copy of ``x`` (head, row,
        d_model), written into ``out`` where given. The gain and the centring are folded into ``W`` once
        (``M``), ``1 / s`` into the gradient's rows, and ``mean(g n)`` is read from ``n M^T`` at d_head
        per head (``mean(n) = 0`` under LN), so the one (head, row, d_model) tensor is a product's output.

        >>> norm = Norm("LN", torch.rand(8, dtype=torch.float64), None, 1e-5)
        >>> W, x, g = (torch.randn(2, 8, 3, dtype=torch.float64), torch.randn(5, 8, dtype=torch.float64),
        ...            torch.randn(2, 5, 3, dtype=torch.float64))
        >>> want = norm.input_gradient(torch.bmm(g, W.transpose(1, 2)), x)
        >>> bool(torch.allclose(norm.through_projection(W)(g, x), want))
        True
        """
        M = W.transpose(1, 2)  # (head, d_head, d_model): dy = grad @ M
        if self.kind is not None and self.gain is not None:
            M = M * self.gain.to(M.dtype)
        if self.centres:
            M = M - M.mean(-1, keepdim=True)
        M = M.contiguous()
        Mt = M.transpose(1, 2)

        def f(grad: torch.Tensor, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
            if self.kind is None:
                return torch.bmm(grad, M, out=out)
            c = self.centre(x)
            s = (c.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()
            n = c / s
            g = grad / s
            ts = (g * torch.matmul(n, Mt)).sum(-1, keepdim=True) / x.shape[-1]  # mean(g n) / s per head and row
            return torch.bmm(g, M, out=out).addcmul_(n, ts, value=-1)

        return f


#: No norm (``normalization_type=None``).
IDENTITY = Norm(None)
