"""The certificate of a model: every identity rs_interp's helpers rely on, checked on the model in hand.

rs_interp's promise is that every number is exact or the helper refuses. The exact helpers rest on a
few structural identities of the residual stream (it adds up, the heads' writes sum to the attention
output, every reader of the stream is one of the graph's receivers, the logits are the unembedding of
the final norm of the final stream, each batch row is computed on its own, ...). They hold by
construction on TransformerLens's own modules, and can fail on a model TransformerLens loads in another
way (a Hugging Face module whose hook is off the forward path, a norm after each sublayer, a run from
layer ``l`` that drops the attention bias) or with a hook the user left on. So they are not assumed:
:func:`certify` checks each one numerically on the model in hand, hooks included, in its own dtype, on
a small probe batch, and each helper declares what it needs (:data:`NEEDS`) and refuses, naming the
identity, the measured gap and what to do, when one fails (:func:`require`). A helper that can also
check an identity on the call's own data at no cost does so (:func:`confirm`), with the same refusal.

Each identity is measured as a relative gap ``max |lhs - rhs| / max |rhs|`` against a tolerance for
the model's dtype and source (:data:`TOLERANCES`: TransformerLens-native modules, or Hugging Face
modules booted by TransformerLens 4, which compute some steps in float32 whatever the dtype). A broken
identity misses by orders of magnitude more (measured gaps: the docs' tolerances page).

The certificate is cached on the model under a key that covers everything that can change a number
(``rs_interp.exact._fingerprint``: weights, dtype, device, every hook of TransformerLens's or PyTorch's on
any module, the config and hook flags); a model whose key cannot be read is measured at every call. It is
measured as far as it is read: :func:`require` measures the identities its helper needs that are not yet
cached under the model's key (each measurement once, :data:`rs_interp.exact._runs.MEASUREMENTS`), and a
later helper that needs more measures only the rest; :func:`certify` measures them all.

>>> import rs_interp as ri
>>> cert = ri.certify(ri.load_toy_model("induction-2l"))
>>> cert.holds("stream", "heads", "readers", "rows"), cert.answers("edge_attribution_patching")
(True, True)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import _backend
from .._backend import Model
from .._messages import LIMIT, clip, few
from .._state import preserve_state
from ._checks import Identity
from ._fingerprint import HOOK_DICTS, Unfingerprintable, fingerprint
from ._runs import measure
from .needs import ADAPTS, CONDITIONS, EXEMPT, IDENTITIES, NEEDS, OPTIONAL, REFUSES
from .stream import mlp_flags
from .validate import check_weights

__all__ = ["Certificate", "Identity", "certify", "require", "confirm", "note_source", "NEEDS", "OPTIONAL", "ADAPTS",
           "EXEMPT", "REFUSES", "CONDITIONS", "CONFIGURATIONS", "IDENTITIES", "TOLERANCES", "REMEDIES"]

#: Relative tolerance of every identity, by dtype and source (``"native"``: TransformerLens's own
#: modules, 3.x's conversions included; ``"booted"``: Hugging Face modules under TransformerLens 4).
TOLERANCES: dict[tuple[torch.dtype, str], float] = {
    (torch.float64, "native"): 1e-10,
    (torch.float64, "booted"): 1e-5,
    (torch.float32, "native"): 1e-4,
    (torch.float32, "booted"): 1e-4,
    # half precision: a few times the largest gap measured on unhooked models of every variant (float16 9e-4,
    # bfloat16 9e-3), so a systematic 4% change (a hook scaling attn_out by 1.04) or ALiBi is not rounding
    (torch.float16, "native"): 5e-3,
    (torch.float16, "booted"): 5e-3,
    (torch.bfloat16, "native"): 2.5e-2,
    (torch.bfloat16, "booted"): 2.5e-2,
}

_HOOKED = "remove the hooks that change what they see (model.reset_hooks())"
#: What to do when an identity fails: the refusal's last sentence (kept short: a refusal holds at most
#: rs_interp._messages.LIMIT characters; certify(model) shows the rest).
REMEDIES: dict[str, str] = {
    "embedding": "a model that scales or normalises its embedding before block 0 has no exact split here",
    "stream": f"{_HOOKED}; a norm after a sublayer outside hook_attn_out/hook_mlp_out has no exact split",
    "z": f"{_HOOKED}; on a Hugging Face-booted bridge, try the other TransformerLens version",
    "heads": f"{_HOOKED}; a norm after the attention other than ln1_post makes a head's write other than z W_O",
    "values": _HOOKED,
    "scores": f"{_HOOKED}; for query/key norms, capped or biased scores or windows, use path patching",
    "scores read": f"{_HOOKED}; a cap, mask or window after hook_attn_scores is not read",
    "projections": _HOOKED,
    "input": _HOOKED,
    "readers": f"{_HOOKED}; else try the other TransformerLens version",
    "head inputs": f"{_HOOKED}; a norm or hook across the heads has no per-head reading",
    "mlp reads": _HOOKED,
    "mlp writes": f"{_HOOKED}; the feature graph reads no norm after the MLP but ln2_post",
    "mlp weights": f"{_HOOKED}; or train a transcoder (features.train_transcoder)",
    "readout": f"{_HOOKED}; a step after the unembedding rs_interp does not read has no exact split",
    "vocabulary": "make cfg.d_vocab_out the number of columns of W_U (model.cfg.d_vocab_out = model.W_U.shape[-1])",
    "gradients": "remove the backward hooks (model.reset_hooks(), or their handles)",
    "rows": "remove the hook that reads or edits the batch as a whole (by row index, or a batch statistic)",
    "start at layer": "nothing: the helpers that read it run every pass from the tokens instead",
    "stop at layer": "try the other TransformerLens version",
    "source": "load the checkpoint with the other TransformerLens version",
}

def _soft_cap(cfg) -> bool:
    return float(getattr(cfg, "output_logits_soft_cap", -1.0) or -1.0) > 0


_NORM_NAMES = {"LN": "LayerNorm", "LNPre": "LayerNorm, weights folded", "RMS": "RMSNorm", "RMSPre": "RMSNorm, weights "
                                                                                                    "folded"}

#: How each configuration of :data:`CONDITIONS` is read off a model's config.
CONFIGURATIONS = {  # each returns what the model has (named in the refusal), or None where it does not apply
    "soft-capped logits": lambda cfg: (f"output_logits_soft_cap {cfg.output_logits_soft_cap:g}" if _soft_cap(cfg)
                                       else None),
    "MLPs or a norm": lambda cfg: (", ".join(x for x in ("MLPs" if not cfg.attn_only else "",
                                                         f"normalization_type {cfg.normalization_type!r} "
                                                         f"({_NORM_NAMES.get(cfg.normalization_type, 'a norm')})"
                                                         if cfg.normalization_type is not None else "") if x)
                                   if not cfg.attn_only or cfg.normalization_type is not None else None),
    "not rotary": lambda cfg: (f"positional_embedding_type {cfg.positional_embedding_type!r}"
                               if cfg.positional_embedding_type != "rotary" else None),
    "attention-only": lambda cfg: "attn_only" if cfg.attn_only else None,
    "parallel blocks": lambda cfg: "parallel_attn_mlp" if getattr(cfg, "parallel_attn_mlp", False) else None,
    "not plain ReLU MLPs": lambda cfg: (
        ("gated " if getattr(cfg, "gated_mlp", False) else "") + f"act_fn {cfg.act_fn!r}"
        if not cfg.attn_only and (cfg.act_fn != "relu" or getattr(cfg, "gated_mlp", False)) else None),
    "bidirectional attention": lambda cfg: (f"attention_dir {cfg.attention_dir!r}"
                                            if getattr(cfg, "attention_dir", "causal") != "causal" else None),
}

_CACHE = "_rs_interp_certificate"
_SOURCE = "_rs_interp_source"


def note_source(model: Model, gap: float, tolerance: float) -> None:
    """Record on ``model`` how far its log-probabilities are from its source's (a checkpoint it was
    converted from, measured by :func:`rs_interp.load_pretrained`): the certificate's ``source``."""
    model.__dict__[_SOURCE] = (float(gap), float(tolerance))


def _needed(helper: str, also: tuple[str, ...] = ()) -> tuple[str, ...]:
    if helper not in NEEDS:
        raise KeyError(f"{helper!r} is not a helper the certificate knows: NEEDS has {sorted(NEEDS)}")
    return tuple(dict.fromkeys((*NEEDS[helper], *also)))


@dataclass(frozen=True)
class Certificate:
    """The identities of :data:`IDENTITIES` measured on one model: every one (:func:`certify`), or those a
    helper needed so far (:func:`require`).

    Attributes:
        identities: one :class:`Identity` per name measured, in the table's order.
        source: ``"native"`` or ``"booted"`` (Hugging Face modules under TransformerLens 4).
        dtype: the model's dtype.
        hooks: where hooks were attached when it was measured (they are part of the model certified).
        configuration: the configurations of :data:`CONDITIONS` the model has (some helpers refuse them).
        details: what the model has, one per configuration (``"act_fn 'gelu'"``), said in refusals.

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
    configuration: tuple[str, ...] = ()
    details: tuple[str, ...] = ()

    def __getitem__(self, name: str) -> Identity:
        for identity in self.identities:
            if identity.name == name:
                return identity
        if name in IDENTITIES:
            raise KeyError(f"the identity {name!r} was not measured for this certificate (require(model, "
                           "helper, also=...) measures what a call reads; rs_interp.certify(model) measures all)")
        raise KeyError(f"no identity {name!r}; one of {list(IDENTITIES)}")

    def measured(self) -> tuple[str, ...]:
        """The names of the identities measured, in the table's order."""
        return tuple(i.name for i in self.identities)

    def holds(self, *names: str) -> bool:
        """Whether every identity named holds (or does not apply)."""
        return all(self[n].holds is not False for n in names)

    def failed(self) -> tuple[str, ...]:
        """The names of the identities that fail."""
        return tuple(i.name for i in self.identities if i.holds is False)

    def answers(self, helper: str, *, also: tuple[str, ...] = ()) -> bool:
        """Whether ``helper`` (a key of :data:`NEEDS`) answers on this model (with ``also``'s identities too)."""
        return self.refusal(helper, also=also) is None

    def refused_configuration(self, helper: str) -> str | None:
        """The first configuration of the model's that ``helper`` refuses (:data:`REFUSES`), or None."""
        return next((c for c in REFUSES.get(helper, ()) if c in self.configuration), None)

    def refusal(self, helper: str, *, also: tuple[str, ...] = ()) -> str | None:
        """Why ``helper`` refuses this model (the first failing identity, its gap and what to do), or None."""
        needed = _needed(helper, also)
        failed = [self[n] for n in needed if self[n].holds is False]
        config = self.refused_configuration(helper)
        if not failed and config is not None:  # a measured failure first: its remedy may be the user's to apply
            has = self.details[self.configuration.index(config)]
            head = f"{helper} refuses this model: {config}, here {clip(has, 80)} ("
            tail = "); no identity can make it exact."
            return head + clip(CONDITIONS[config], LIMIT - len(head) - len(tail)) + tail
        if not failed:
            return None
        first = failed[0]
        more = f" ({few((i.name for i in failed[1:]), show=str)} fail too)" if failed[1:] else ""
        gap = "not measured" if first.gap != first.gap else f"gap {first.gap:.3g} > tolerance {first.tolerance:.0e}"
        # a hook point by its first name (4.x's aliases follow " = ")
        hooked = (f" Hooks are attached at {few((h.split(' = ')[0] for h in self.hooks), 1, show=str)}."
                  if self.hooks else "")
        head = f"{helper} refuses this model: the identity '{first.name}' fails ({gap}: "
        tail = f"){more}. What to do: {REMEDIES.get(first.name, _HOOKED)}.{hooked} All: rs_interp.certify(model)."
        # the measured reason, as much of it as the limit leaves (the whole of it: certify(model))
        return head + clip(first.why, max(50, LIMIT - len(head) - len(tail))) + tail

    def table(self) -> str:
        """Two text tables: every identity with its gap, tolerance and the helpers that need it; then every
        helper of :data:`NEEDS` with whether it answers on this model (and, where not, the identity)."""
        lines = [f"certificate of a {self.source} {str(self.dtype).replace('torch.', '')} model"
                 + (f" (hooks attached at {', '.join(self.hooks)})" if self.hooks else ""),
                 f"{'identity':<15} {'holds':<6} {'gap':>9} {'tolerance':>9}  helpers that need it"]
        for i in self.identities:
            mark = {True: "yes", False: "NO", None: "n/a"}[i.holds]
            users = sum(i.name in needs for needs in NEEDS.values())
            gap = "-" if i.gap != i.gap else f"{i.gap:.1e}"
            lines.append(f"{i.name:<15} {mark:<6} {gap:>9} {i.tolerance:>9.0e}  {users}")
            if i.holds is False:
                lines.append(f"{'':<15} {i.why}")
        lines += ["", f"{'helper':<34} answers"]
        fails = set(self.failed())
        unmeasured = [n for n in IDENTITIES if n not in self.measured()]
        if unmeasured:
            lines.append(f"{'':<15} not measured: {', '.join(unmeasured)} (rs_interp.certify(model) measures all)")
        for helper in NEEDS:
            failed = [n for n in NEEDS[helper] if n in fails]
            config = self.refused_configuration(helper)
            word = "no: " + ", ".join(failed) if failed else f"no: {config} (configuration)" if config else "yes"
            if not failed and not config and any(n in unmeasured for n in NEEDS[helper]):
                word = "not measured"
            opt = [f"{w}: needs {n}" for n, w in OPTIONAL.get(helper, {}).items() if n in fails]
            adapt = [f"{n} fails: {what}" for n, what in ADAPTS.get(helper, {}).items() if n in fails]
            lines.append(f"{helper:<34} {word}" + "".join(f"; {x}" for x in opt + adapt))
        return "\n".join(lines)

    __str__ = table

    def _repr_pretty_(self, printer, cycle) -> None:  # IPython shows the table
        printer.text(self.table())


def _attached(model: Model) -> tuple[str, ...]:
    """Where hooks are attached: TransformerLens hook points (once, by every name a 4.x alias gives
    them) and modules with PyTorch hooks of their own."""
    names: dict[int, list[str]] = {}
    hook_dict = model.hook_dict  # (a bridge builds it at each read)
    for name, hp in hook_dict.items():
        if hp._forward_hooks or hp._backward_hooks:
            names.setdefault(id(hp), []).append(name)
    points = {id(hp) for hp in hook_dict.values()}
    out = [" = ".join(sorted(v, key=lambda n: ("hook_in" in n or "hook_out" in n, n))) for v in names.values()]
    for name, module in model.named_modules():
        if id(module) not in points and any(not _backend.is_own_hook(fn) for d in HOOK_DICTS
                                            for fn in getattr(module, d, {}).values()):
            out.append(f"{name or 'the model'} (PyTorch hook)")
    return tuple(out)


#: Configurations read off the model's modules (4.x's config does not say a block is post-norm).
MODULE_CONFIGURATIONS = {
    "post-norm blocks": lambda model: ("a norm after each sublayer (ln1_post, ln2_post)"
                                       if _backend.has_post_norms(model) else None),
}


def _configuration(model: Model) -> dict[str, tuple[str, ...]]:
    found = ({c: has(model.cfg) for c, has in CONFIGURATIONS.items()}
             | {c: has(model) for c, has in MODULE_CONFIGURATIONS.items()})
    return {"configuration": tuple(c for c, v in found.items() if v is not None),
            "details": tuple(v for v in found.values() if v is not None)}


def certify(model: Model, *, refresh: bool = False) -> Certificate:
    """The :class:`Certificate` of ``model``: every identity of :data:`IDENTITIES` measured on it
    (module docstring), cached on the model until anything in its key changes (``refresh=True``
    measures again). Shown as a table (``print(cert)``, or the cell's output).

    Example:
        >>> import rs_interp as ri
        >>> print(ri.certify(ri.load_toy_model("induction-2l")).table().splitlines()[0])
        certificate of a native float32 model
    """
    return _measured(model, tuple(IDENTITIES), refresh=refresh)


def require(model: Model, helper: str, *, also: tuple[str, ...] = (), adapts: bool = True) -> Certificate:
    """The model's certificate, if every identity ``helper`` needs (:data:`NEEDS`, plus ``also``) holds: those
    are measured (the ones not yet cached under the model's key), with the identities the helper adapts to
    (:data:`ADAPTS`; ``adapts=False`` where this call reads none of them), and no other.

    Raises:
        ValueError: the first identity that fails, named with its gap, what it means and what to do.
    """
    read = (*_needed(helper, also), *(ADAPTS.get(helper, {}) if adapts else ()))
    cert = _measured(model, read)
    why = cert.refusal(helper, also=also)
    if why is not None:
        raise ValueError(why)
    return cert


def _source(model: Model, tol: float) -> Identity:
    """``source``: what :func:`note_source` recorded (the loader's measurement), or not applicable."""
    noted = model.__dict__.get(_SOURCE)
    if noted is None:
        return Identity("source", None, float("nan"), tol)
    return Identity("source", noted[0] <= noted[1], noted[0], noted[1], "the model is not its checkpoint's function")


def _measured(model: Model, names: tuple[str, ...], *, refresh: bool = False) -> Certificate:
    """The model's certificate with at least ``names`` measured: the cached one where its key still holds
    and it has them, else the cached identities (key unchanged) and the missing ones measured now."""
    check_weights(model)
    try:
        key = fingerprint(model)
    except Unfingerprintable:
        key = None  # measured at every call: nothing can say a cached certificate still holds
    cached = model.__dict__.get(_CACHE)
    known = cached[1] if key is not None and cached is not None and cached[0] == key and not refresh else None
    have = {} if known is None else {i.name: i for i in known.identities}
    missing = tuple(n for n in names if n not in have)
    if known is not None and not missing:
        return known
    tol = TOLERANCES.get((model.cfg.dtype, _backend.model_source(model)), 1e-4)
    hooks = _attached(model) if known is None else known.hooks
    wanted = tuple(n for n in missing if n != "source")
    if wanted:
        with preserve_state(model, **mlp_flags(model)), _backend.kept_caches(model):
            have |= {n: i for n, i in measure(model, tol, wanted).items() if n not in have}
    have.setdefault("source", _source(model, tol))
    cert = Certificate(identities=tuple(have[name] for name in IDENTITIES if name in have),
                       source=_backend.model_source(model), dtype=model.cfg.dtype, hooks=hooks, **_configuration(model))
    if key is not None:
        model.__dict__[_CACHE] = (key, cert)
    return cert


#: Slack of :func:`confirm`, in units of machine epsilon (of the coarser of the run's dtype and the
#: compute dtype) times the size of the terms summed. Measured gaps: ~1 such unit in float16 and
#: bfloat16, < 10 in float32 and float64; a changed run moves it by far more.
_EPS_FACTOR = 64


def confirm(helper: str, identity: str, total: torch.Tensor, target: torch.Tensor, terms: torch.Tensor,
            run_dtype: torch.dtype, source: str = "native") -> None:
    """An identity checked again on the call's own data: ``total`` (the sum of ``terms``, a
    decomposition) equals ``target`` (the run's own value) to rounding, of the coarser of the terms'
    and the run's dtype (and of float32 for Hugging Face modules, ``source="booted"``).

    Raises:
        ValueError: as :func:`require` does, naming ``identity``: on this batch the run is not the one
            decomposed (a hook that acts on some inputs only, or a part no identity sees).
    """
    eps = max(torch.finfo(terms.dtype).eps, torch.finfo(run_dtype).eps,
              torch.finfo(torch.float32).eps if source == "booted" else 0.0)
    size = terms.abs().sum(0).amax() + target.abs().amax() + 1.0
    gap = (total - target.to(total.dtype)).abs().amax()
    if bool(gap <= _EPS_FACTOR * eps * size):
        return
    raise ValueError(f"{helper} refuses this batch: the identity '{identity}' fails on it (the parts sum to a value "
                     f"{float(gap):.3g} away from the run's own, {float(gap / size):.2g} of their size; it held on the "
                     "certificate's probe, so something acts on this batch only: a hook that reads the tokens, or a "
                     f"part of the model no identity sees). What to do: {REMEDIES.get(identity, _HOOKED)}.")
