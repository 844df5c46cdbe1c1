"""The certificate of a model: every identity rs_interp's helpers rely on, checked on the model in hand.

rs_interp's promise is that every number is exact or the helper refuses. The exact helpers rest on a
few structural identities of the residual stream (it adds up, the heads' writes sum to the attention
output, every reader of the stream is one of the graph's receivers, the logits are the unembedding of
the final norm of the final stream, ...). They hold by construction on TransformerLens's own
modules, and can fail on a model TransformerLens loads in another way (a Hugging Face module whose
hook is off the forward path, a norm after each sublayer, a run from layer ``l`` that drops the
attention bias). So they are not assumed: :func:`certify` checks each one numerically on the model
in hand, in its own dtype, on a small probe batch, and each helper declares what it needs
(:data:`NEEDS`) and refuses, naming the identity, when one fails (:func:`require`).

Each identity is measured as a relative gap ``max |lhs - rhs| / max |rhs|`` against a tolerance for
the model's dtype and source (:data:`TOLERANCES`: TransformerLens-native modules, or Hugging Face
modules booted by TransformerLens 4, which compute some steps in float32 whatever the dtype). A broken
identity misses by orders of magnitude more (measured gaps: the docs' tolerances page).

The certificate is cached on the model and computed again when its weights (any in-place change), its
attached hooks or its dtype change.

>>> import rs_interp as ri
>>> cert = ri.certify(ri.load_toy_model("induction-2l"))
>>> cert.holds("stream", "heads", "readers"), cert["readers"].gap < cert["readers"].tolerance
(True, True)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import _backend
from ._backend import Model
from ._certify_checks import Identity, measure
from ._state import preserve_state
from ._stream import mlp_flags

__all__ = ["Certificate", "Identity", "certify", "require", "note_source", "NEEDS", "IDENTITIES", "TOLERANCES"]

#: What each identity says, in the order of the table.
IDENTITIES: dict[str, str] = {
    "embedding": "blocks.0.hook_resid_pre = hook_embed (+ hook_pos_embed for learned positions)",
    "stream": "each block adds its outputs: resid_pre + attn_out = resid_mid, resid_mid + mlp_out = resid_post "
              "(parallel: resid_pre + attn_out + mlp_out = resid_post); resid_post = the next resid_pre",
    "z": "hook_z is on the forward path (the heads' outputs are made from it)",
    "heads": "the heads' z W_O, summed, plus b_O are attn_out (a head writes z W_O into the stream)",
    "values": "each head's z is its pattern times ln1(resid_pre) W_V + b_V",
    "projections": "hook_q, hook_k, hook_v are ln1(resid_pre) W + b per head, where edge methods read them so",
    "input": "blocks.0.hook_resid_pre is on the forward path",
    "readers": "the heads' q, k, v inputs, the MLPs' inputs (hook_mlp_in) and the final stream are every reader "
               "of the stream: their gradients add up to the stream's",
    "readout": "the logits are the unembedding of the final norm of the final stream (soft-cap included)",
    "start at layer": "model(resid_pre_l, start_at_layer=l) reproduces the full run",
    "stop at layer": "model(tokens, stop_at_layer=l) returns blocks.l.hook_resid_pre (the final stream for n_layers)",
    "source": "the log-probabilities are those of the checkpoint the model was loaded from (load_pretrained)",
}

#: The identities each helper relies on (it refuses when one fails). The scan and exact path patching
#: read ``start at layer`` as an option: where it fails they run every pass from the tokens.
NEEDS: dict[str, tuple[str, ...]] = {
    "direct_logit_attribution": ("embedding", "stream", "z", "heads", "readout"),
    "second_order_attribution": ("embedding", "stream", "z", "heads", "values", "readout"),
    "attribution_patching": ("z", "input"),
    "edge_attribution_patching": ("stream", "z", "heads", "input", "readers", "projections"),
    "path_patching": ("stream", "z", "heads", "readers"),
    "evaluate_circuit": ("stream", "z", "heads", "readers"),
    "faithfulness_curve": ("stream", "z", "heads", "readers"),
    "acdc": ("stream", "z", "heads", "readers"),
    "head_ablation_scan": ("z",),
    "ablate_heads": ("z",),
    "logit_lens": ("readout", "stop at layer"),
}

#: Relative tolerance of every identity, by dtype and source (``"native"``: TransformerLens's own
#: modules, 3.x's conversions included; ``"booted"``: Hugging Face modules under TransformerLens 4).
TOLERANCES: dict[tuple[torch.dtype, str], float] = {
    (torch.float64, "native"): 1e-10,
    (torch.float64, "booted"): 1e-5,
    (torch.float32, "native"): 1e-4,
    (torch.float32, "booted"): 1e-4,
    (torch.float16, "native"): 5e-2,
    (torch.float16, "booted"): 5e-2,
    (torch.bfloat16, "native"): 5e-2,
    (torch.bfloat16, "booted"): 5e-2,
}

_CACHE = "_rs_interp_certificate"
_SOURCE = "_rs_interp_source"


def note_source(model: Model, gap: float, tolerance: float) -> None:
    """Record on ``model`` how far its log-probabilities are from its source's (a checkpoint it was
    converted from, measured by :func:`rs_interp.load_pretrained`): the certificate's ``source``."""
    model.__dict__[_SOURCE] = (float(gap), float(tolerance))


@dataclass(frozen=True)
class Certificate:
    """Every identity of :data:`IDENTITIES` on one model (:func:`certify`).

    Attributes:
        identities: one :class:`Identity` per name, in the table's order.
        source: ``"native"`` or ``"booted"`` (Hugging Face modules under TransformerLens 4).
        dtype: the model's dtype.
        hooks: the hook points that carried hooks when it was measured (they are part of the model).

    Example:
        >>> import rs_interp as ri
        >>> cert = ri.certify(ri.load_toy_model("induction-2l"))
        >>> cert.failed(), cert["start at layer"].holds
        ((), True)
    """

    identities: tuple[Identity, ...]
    source: str
    dtype: torch.dtype
    hooks: tuple[str, ...] = ()

    def __getitem__(self, name: str) -> Identity:
        for identity in self.identities:
            if identity.name == name:
                return identity
        raise KeyError(f"no identity {name!r}; one of {list(IDENTITIES)}")

    def holds(self, *names: str) -> bool:
        """Whether every identity named holds (or does not apply)."""
        return all(self[n].holds is not False for n in names)

    def failed(self) -> tuple[str, ...]:
        """The names of the identities that fail."""
        return tuple(i.name for i in self.identities if i.holds is False)

    def table(self) -> str:
        """The identities as a text table: each with its gap, tolerance and the helpers that need it."""
        lines = [f"certificate of a {self.source} {str(self.dtype).replace('torch.', '')} model"
                 + (f" (hooks attached at {', '.join(self.hooks)})" if self.hooks else ""),
                 f"{'identity':<15} {'holds':<6} {'gap':>9} {'tolerance':>9}  needed by"]
        for i in self.identities:
            mark = {True: "yes", False: "NO", None: "n/a"}[i.holds]
            users = ", ".join(h for h, needs in NEEDS.items() if i.name in needs) or "-"
            gap = "-" if i.gap != i.gap else f"{i.gap:.1e}"
            lines.append(f"{i.name:<15} {mark:<6} {gap:>9} {i.tolerance:>9.0e}  {users}")
            if i.holds is False:
                lines.append(f"{'':<15} {i.why}")
        return "\n".join(lines)

    __str__ = table

    def _repr_pretty_(self, printer, cycle) -> None:  # IPython shows the table
        printer.text(self.table())


def _fingerprint(model: Model) -> tuple:
    """What the certificate depends on: every tensor's storage and version counter (any in-place change
    bumps it), the attached hooks and the config fields that change the function."""
    tensors = tuple((t.data_ptr(), t._version, t.dtype) for t in (*model.parameters(), *model.buffers()))
    hooks = tuple((name, tuple(hp._forward_hooks), tuple(hp._backward_hooks)) for name, hp in model.hook_dict.items()
                  if hp._forward_hooks or hp._backward_hooks)
    cfg = model.cfg
    fields = tuple(repr(getattr(cfg, k, None)) for k in ("normalization_type", "positional_embedding_type", "parallel_attn_mlp",
                                                         "output_logits_soft_cap", "attn_only", "n_layers", "dtype"))
    return tensors, hooks, fields, model.__dict__.get(_SOURCE)


def certify(model: Model, *, refresh: bool = False) -> Certificate:
    """The :class:`Certificate` of ``model``: every identity of :data:`IDENTITIES` measured on it
    (module docstring), computed once and cached on the model until its weights, hooks or dtype
    change (``refresh=True`` measures again). Shown as a table (``print(cert)``, or the cell's output).

    Example:
        >>> import rs_interp as ri
        >>> print(ri.certify(ri.load_toy_model("induction-2l")).table().splitlines()[0])
        certificate of a native float32 model
    """
    key = _fingerprint(model)
    cached = model.__dict__.get(_CACHE)
    if cached is not None and cached[0] == key and not refresh:
        return cached[1]
    tol = TOLERANCES.get((model.cfg.dtype, _backend.model_source(model)), 1e-4)
    names: dict[int, list[str]] = {}  # a hook point once, by every name it has (4.x's aliases: "blocks.0.hook_resid_pre = blocks.0.hook_in")
    for name, hp in model.hook_dict.items():
        if hp._forward_hooks:
            names.setdefault(id(hp), []).append(name)
    hooks = tuple(" = ".join(sorted(v, key=lambda n: ("hook_in" in n or "hook_out" in n, n))) for v in names.values())
    with preserve_state(model, **mlp_flags(model)):
        measured = measure(model, tol)
    noted = model.__dict__.get(_SOURCE)
    measured["source"] = (Identity("source", None, float("nan"), tol) if noted is None
                          else Identity("source", noted[0] <= noted[1], noted[0], noted[1], "the model is not its checkpoint's function"))
    cert = Certificate(identities=tuple(measured[name] for name in IDENTITIES), source=_backend.model_source(model),
                       dtype=model.cfg.dtype, hooks=hooks)
    model.__dict__[_CACHE] = (key, cert)
    return cert


def require(model: Model, helper: str, *, also: tuple[str, ...] = ()) -> Certificate:
    """The model's certificate, if every identity ``helper`` needs (:data:`NEEDS`, plus ``also``) holds.

    Raises:
        ValueError: the first identity that fails, named with what it means, e.g. "this model's MLP
            input hook is not on the forward path: edges into MLPs cannot be patched".
    """
    cert = certify(model)
    failed = [cert[n] for n in (*NEEDS[helper], *also) if cert[n].holds is False]
    if failed:
        first = failed[0]
        more = f" ({', '.join(i.name for i in failed[1:])} fail too)" if failed[1:] else ""
        hooked = f" Hooks are attached at {', '.join(cert.hooks)}: they are part of the model certified." if cert.hooks else ""
        raise ValueError(f"{helper} refuses this model: the identity '{first.name}' fails ({first.why}){more}; "
                         f"rs_interp.certify(model) shows every identity.{hooked}")
    return cert

