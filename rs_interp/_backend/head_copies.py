"""Query and key norms that span the heads (OLMo-2, OLMoE): each head's own copy of the norm under the
per-head inputs.

OLMo-2 and OLMoE normalise the queries of all heads together, ``q = q_norm(x W_Q)`` over the
``n_heads * d_head`` concatenated projections (the keys alike, over the KV heads). An edge into head
``h``'s query means: head ``h``'s query is computed from the moved input,

    q_h = slice_h(q_norm((x + d) W_Q)),

and every other head's query is unchanged (the definition every other family obeys). TransformerLens's
per-head inputs (3.9's ``use_split_qkv_input``, 4.3's split-input fork) project each head's input with its
own ``W_Q^h`` and then normalise the concatenation: moving head ``h``'s input moves the norm's scale of
every head, and head ``h``'s own query is not the moved one. While rs_interp's per-head inputs are on
(:func:`rs_interp._backend.per_head_inputs`), the norm's output is replaced by each head's own copy: for
head (or KV head) ``h`` with input ``u_h`` (as the projection reads it, after the norm before the
attention), every head's projection of ``u_h`` by the model's own weights, the model's own norm of that,
and its slice ``h``. Where every head reads the same input this is the model's own query, exactly; moving
``u_h`` moves head ``h``'s query alone, by the definition. The certificate's ``head inputs`` measures it.

Each version says how it sees ``u_h`` and names the modules (:class:`SpanningNorm`): the contract's
``spanning_norms`` and ``seen_head_inputs`` (:class:`.contract.Backend`; 4.x's in :mod:`._tl4_readers`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

__all__: list[str] = []


@dataclass(frozen=True)
class SpanningNorm:
    """One query or key norm of a layer that spans its heads, as the model computes it.

    Attributes:
        layer: the layer.
        which: ``"q"`` or ``"k"``.
        module: the module the attention calls on the concatenated projections (its output is replaced).
        project: ``u (..., d_model) -> (..., n * d_head)``: every head's (or KV head's) projection of one
            input by the model's own weights, heads in the norm's order.
        normalise: the norm on any leading shape, as the model computes it (its own module's arithmetic).
    """

    layer: int
    which: str
    module: torch.nn.Module
    project: Callable[[torch.Tensor], torch.Tensor]
    normalise: Callable[[torch.Tensor], torch.Tensor]


def spans(norm: Any, d_head: int) -> bool:
    """Whether ``norm`` (a query or key norm module, or None) normalises more than one head's ``d_head``
    dimensions together (its gain's length: ``weight`` on Hugging Face modules, ``w`` on TransformerLens's)."""
    if norm is None:
        return False
    w = getattr(norm, "weight", getattr(norm, "w", None))
    w = getattr(getattr(norm, "original_component", None), "weight", None) if not isinstance(w, torch.Tensor) else w
    return isinstance(w, torch.Tensor) and w.shape[-1] > d_head


def own_copies(norm: SpanningNorm, u: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Each head's own copy of the norm (module docstring): ``u`` (batch, pos, n, d_model), the ``n`` heads'
    (or KV heads') inputs as the projection reads them -> (batch, pos, n * d_head) in ``dtype``, slice ``h``
    the norm of every head's projection of ``u_h``, taken at ``h``."""
    full = norm.project(u)  # (batch, pos, n, n * d_head): copy h holds every head's projection of u_h
    n = u.shape[-2]
    normed = norm.normalise(full).unflatten(-1, (n, -1))  # (batch, pos, copy, head, d_head)
    idx = torch.arange(n, device=u.device)
    return normed[..., idx, idx, :].flatten(-2).to(dtype)


@contextlib.contextmanager
def per_head_copies(norms: list[SpanningNorm],
                    seen: Callable[[dict], contextlib.AbstractContextManager]) -> Iterator[None]:
    """For the block, each of ``norms``' outputs replaced by :func:`own_copies` on a pass where the per-head
    inputs are on (``seen(box)``, the version's context that records each layer's per-head inputs in ``box``
    by ``(layer, which)`` as the projection reads them); a pass without them (nothing recorded) keeps the
    model's own output. Each replacement runs ahead of any other hook on the module."""
    if not norms:
        yield
        return
    box: dict[tuple[int, str], torch.Tensor] = {}
    handles = []

    def replace(norm: SpanningNorm) -> Callable:
        def hook(module: torch.nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor | None:
            u = box.pop((norm.layer, norm.which), None)
            return None if u is None else own_copies(norm, u, out.dtype).view(out.shape)
        return hook

    try:
        for norm in norms:
            handles.append(norm.module.register_forward_hook(replace(norm), prepend=True))
        with seen(box):
            yield
    finally:
        for handle in handles:
            handle.remove()
        box.clear()
