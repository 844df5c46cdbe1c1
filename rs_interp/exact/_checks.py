"""The identities read off one clean run of the probe batch (:func:`clean_run`), each a relative gap of
the model's own activations against what rs_interp computes from them by hand (the norms by
:mod:`rs_interp.exact.norm`), in the dtype the model computes in (:func:`rs_interp.exact.readout.compute_dtype`:
float32 for a half-precision model; the gap itself in float64). The runs of their own (gradients, rows, from
and to a layer) are :mod:`rs_interp.exact._runs`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .. import _backend
from .. import _names as N
from .._backend import Model, Stop, attn_weight, logit_softcap
from .._messages import clip
from ..hooks import store_matching
from .readout import compute_dtype, d_vocab_out, readout

__all__: list[str] = []

_PROBE = (2, 8)  # (batch, pos) of the probe batch
#: The errors a model's own modules raise where an identity cannot hold (a shape the bridge does not
#: expect, a missing attribute, a dtype a kernel refuses); anything else (a user's hook raising its own
#: exception, a KeyboardInterrupt) propagates.
MODEL_ERRORS = (RuntimeError, TypeError, AttributeError, IndexError, KeyError, NotImplementedError, ValueError)


@dataclass(frozen=True)
class Identity:
    """One identity measured on one model.

    Attributes:
        name: its key in :data:`rs_interp.exact.certificate.IDENTITIES`.
        holds: True or False; None where it does not apply (e.g. MLP inputs of an attention-only model).
        gap: the largest relative gap measured (NaN where nothing could be measured).
        tolerance: the tolerance for the model's dtype and source.
        why: on failure, what fails and what it means for the helpers.
    """

    name: str
    holds: bool | None
    gap: float
    tolerance: float
    why: str = ""


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """``max |a - b| / max |b|`` in float64 (0 when both are 0)."""
    a, b = a.detach().to(torch.float64), b.detach().to(torch.float64)
    if a.shape != b.shape:
        return float("inf")
    scale = float(b.abs().max()) if b.numel() else 0.0
    gap = float((a - b).abs().max()) if b.numel() else 0.0
    return gap / scale if scale > 0 else (0.0 if gap == 0 else float("inf"))


def probe(model: Model, seed: int = 0, batch: int = _PROBE[0], pos: int = _PROBE[1]) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.cfg.d_vocab, (batch, min(pos, model.cfg.n_ctx)), generator=g).to(model.cfg.device)


class Missing(Exception):
    """A hook point an identity reads is absent."""


def get(box: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    if name not in box:
        raise Missing(name)
    return box[name]


def judge(name: str, tol: float, fn: Callable[[], tuple[float, str]], applies: bool = True) -> Identity:
    """Run one check: ``fn`` returns (relative gap, what fails where the gap is over ``tol``); an
    exception or a missing hook point fails the identity, named."""
    if not applies:
        return Identity(name, None, float("nan"), tol)
    try:
        gap, why = fn()
    except Missing as err:
        return Identity(name, False, float("nan"), tol, f"the model has no hook point {err.args[0]}")
    except MODEL_ERRORS as err:  # the model's own modules: an error there means the identity cannot hold
        return Identity(name, False, float("nan"), tol, f"{type(err).__name__}: {str(err)[:160]}")
    ok = gap <= tol
    return Identity(name, ok, gap, tol, "" if ok else why)


class _Worst:
    """The largest gap seen and where."""

    def __init__(self) -> None:
        self.gap, self.where = 0.0, ""

    def see(self, gap: float, where: str) -> None:
        if gap > self.gap or (gap != gap and self.gap == self.gap):
            self.gap, self.where = gap, where


def _normed(model: Model, l: int, name: str, x: torch.Tensor) -> torch.Tensor:
    """Layer ``l``'s norm ``name`` (``"ln1"``, ``"ln2"``) of ``x`` in the compute dtype
    (:func:`rs_interp._backend.pre_norm`)."""
    dt = compute_dtype(model)
    return _backend.pre_norm(model, l, name).to(dt).apply(x.to(dt))


def clean_run(model: Model, tokens: torch.Tensor, *, logits: bool = True) -> dict[str, torch.Tensor]:
    """The probe's activations: every hook point the identities read (as it leaves the point, after any
    hook on it), each MLP's input and output as its module sees them (``mlp_in L``, ``mlp_out L``: the
    output before any hook on the module) and ``hook_mlp_out`` as it enters its point (``mlp_write L``,
    before any hook on it), each layer's scores as the helpers read them (``scores read L``:
    :func:`rs_interp._backend.score_hooks`, which only record), and the logits. Without ``logits`` the run
    ends at the final stream (:class:`rs_interp._backend.Stop`): the same activations, no unembedding."""
    wanted = (N.EMBED, N.POS_EMBED, N.resid_pre, N.resid_mid, N.attn_out, N.mlp_in, N.mlp_out, N.resid_post, N.z,
              N.q, N.k, N.v, N.pattern)
    box: dict[str, torch.Tensor] = {}
    if model.cfg.attn_only:  # hook_mlp_in exists but may not be switched on
        wanted = tuple(w for w in wanted if w is not N.mlp_in)
    # the caller's
    attached = sorted(n for n, hp in model.hook_dict.items() if hp._forward_hooks or hp._forward_pre_hooks)
    fwd = store_matching(box, model, N.every(*wanted))
    fwd += _score_hooks(model, box)
    if not logits and model.cfg.n_layers:
        fwd.append((N.final_stream(model.cfg.n_layers), _stop))
    handles = _module_captures(model, box)
    try:
        with torch.no_grad(), model.hooks(fwd_hooks=fwd):
            try:
                box["logits"] = model(tokens, return_type="logits")
            except Stop:
                pass
            except MODEL_ERRORS as err:
                if attached:  # the caller's hooks may be the error: theirs propagates, with where it happened
                    err.add_note(f"rs_interp: raised on the certificate's probe batch {tuple(tokens.shape)} with hooks "
                                 "attached "
                                 f"at {', '.join(attached[:4])}; a hook that works at one input shape only cannot be "
                                 "checked: make it follow the shape it is given, or remove it (model.reset_hooks())")
                    raise
                raise ValueError(f"the model's forward pass raises {type(err).__name__} on a probe batch "
                                 f"({clip(err, 160)}): rs_interp cannot check or use it in dtype {model.cfg.dtype}; "
                                 "try another dtype (e.g. torch.float32) or the other TransformerLens version") from err
    finally:
        for handle in handles:
            handle.remove()
    # a bridge's flattened region (OPT's fc1/fc2, (batch * pos, ...)): a view, the same numbers
    for key, t in box.items():
        if (key.startswith(("mlp_in ", "mlp_out ", "mlp_write ")) and t.dim() == 2 and tokens.dim() == 2
                and t.shape[0] == tokens.numel()):
            box[key] = t.view(*tokens.shape, t.shape[-1])
    return box


def _stop(t: torch.Tensor, *, hook) -> None:
    raise Stop


def _first(out) -> torch.Tensor:
    """A module's tensor (the first of a tuple), detached."""
    return (out[0] if isinstance(out, tuple) else out).detach()


def _score_hooks(model: Model, box: dict[str, torch.Tensor]) -> list[tuple[str, Callable]]:
    """:func:`rs_interp._backend.score_hooks` of every layer, into ``box["scores read L"]``; one that raises, or
    whose hook point is absent, is recorded (``"scores read error"``, ``"scores read missing"``), so that it fails
    ``scores read`` alone (:func:`scores_read`) and the clean run goes on."""
    def guarded(fn: Callable) -> Callable:
        def hook(t: torch.Tensor, *, hook) -> None:
            try:
                fn(t, hook=hook)
            except MODEL_ERRORS as err:
                box.setdefault("scores read error", err)
        return hook

    out, points = [], model.hook_dict  # (a bridge builds hook_dict at each read)
    for l in range(model.cfg.n_layers):
        for name, fn in _backend.score_hooks(model, l, box, f"scores read {l}"):
            if name in points:
                out.append((name, guarded(fn)))
            else:
                box.setdefault("scores read missing", name)
    return out


def _module_captures(model: Model, box: dict[str, torch.Tensor]) -> list:
    """PyTorch hooks recording each MLP's input and output as its module sees them and ``hook_mlp_out`` as it
    enters its point (:func:`clean_run`); their handles, for the caller to remove."""
    handles: list = []
    if model.cfg.attn_only:
        return handles
    points = model.hook_dict  # (a bridge builds it at each read)
    for l, block in enumerate(model.blocks):
        if getattr(block, "mlp", None) is None:
            continue
        # where a bridge's MLP is read (OPT's fc1/fc2, BLOOM's out-projection)
        mlp, writes = _backend.mlp_modules(model, l)
        handles.append(mlp.register_forward_pre_hook(
            lambda mod, args, kwargs, l=l: box.__setitem__(f"mlp_in {l}", _first(args or tuple(kwargs.values()))),
            with_kwargs=True))
        handles.append(writes.register_forward_hook(
            lambda mod, args, out, l=l: box.__setitem__(f"mlp_out {l}", _first(out)),
            prepend=True))  # ahead of any hook of the caller's: the module's own output
        point = points.get(N.mlp_out(l))
        if point is not None:  # a PyTorch hook on the point, ahead of every other: the value entering it
            handles.append(point.register_forward_hook(
                lambda mod, args, out, l=l: box.__setitem__(f"mlp_write {l}", out.detach()), prepend=True))
    return handles


def embedding(model: Model, box: dict) -> tuple[float, str]:
    want = get(box, N.EMBED)
    if model.cfg.positional_embedding_type == "standard":
        want = want + get(box, N.POS_EMBED)
    return rel(get(box, N.RESID0), want), ("the stream entering block 0 is not the token (and learned position) "
                                           "embedding: "
                                           "something between them (an embedding norm or scale) is not a component")


def stream(model: Model, box: dict) -> tuple[float, str]:
    cfg, worst = model.cfg, _Worst()
    parallel = bool(getattr(cfg, "parallel_attn_mlp", False))
    for l in range(cfg.n_layers):
        pre, attn, post = get(box, N.resid_pre(l)), get(box, N.attn_out(l)), get(box, N.resid_post(l))
        if cfg.attn_only:
            pairs = [(post, pre + attn, "resid_pre + attn_out = resid_post")]
        elif parallel:
            pairs = [(post, pre + attn + get(box, N.mlp_out(l)), "resid_pre + attn_out + mlp_out = resid_post")]
        else:
            mid = get(box, N.resid_mid(l))
            pairs = [(mid, pre + attn, "resid_pre + attn_out = resid_mid"), (post, mid + get(box, N.mlp_out(l)),
                                                                             "resid_mid + mlp_out = resid_post")]
        if l + 1 < cfg.n_layers:
            pairs.append((get(box, N.resid_pre(l + 1)), post, "resid_post = the next resid_pre"))
        for lhs, rhs, what in pairs:
            worst.see(rel(lhs, rhs), f"layer {l}: {what}")
    return worst.gap, (f"the stream does not add up ({worst.where}): a block changes what its sublayers write before "
                       "adding it (a norm after a sublayer?) or the config's block form is not the model's")


def _per_query_head(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    return t.repeat_interleave(n_heads // t.shape[2], dim=2)


def _weights(model: Model, l: int, which: str, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``W_{which}``, ``b_{which}`` of layer ``l`` in the compute dtype, one per head of the hook (query or KV
    heads)."""
    cfg, attn = model.cfg, model.blocks[l].attn
    W, b = attn_weight(attn, f"W_{which.upper()}", cfg.n_heads), attn_weight(attn, f"b_{which.upper()}", cfg.n_heads)
    if heads != cfg.n_heads:
        W, b = W[:: cfg.n_heads // heads], b[:: cfg.n_heads // heads]
    dt = compute_dtype(model)
    return W.detach().to(dt), b.detach().to(dt)


def _projected(model: Model, box: dict, l: int, which: str, heads: int) -> torch.Tensor:
    """``ln1(resid_pre) W + b`` of layer ``l`` for ``which`` (q, k or v), by hand, one per head of the hook; kept in
    ``box`` (``values``, ``scores`` and ``projections`` read the same ones)."""
    key = f"by hand {which} {l} {heads}"
    if key not in box:
        x = box.get(f"by hand ln1 {l}")
        if x is None:
            x = box[f"by hand ln1 {l}"] = _normed(model, l, "ln1", get(box, N.resid_pre(l)))
        W, b = _weights(model, l, which, heads)
        if which != "v" and model.cfg.positional_embedding_type == "shortformer":
            x = x + get(box, N.POS_EMBED).to(x.dtype)  # shortformer: queries and keys read the positions too
        box[key] = torch.einsum("bpm,hmd->bphd", x, W) + b
    return box[key]


def values(model: Model, box: dict) -> tuple[float, str]:
    cfg, worst = model.cfg, _Worst()
    for l in range(cfg.n_layers):
        v = get(box, N.v(l))
        v_hand = _projected(model, box, l, "v", v.shape[2])
        pattern, v_heads = get(box, N.pattern(l)).to(v_hand.dtype), _per_query_head(v.to(v_hand.dtype), cfg.n_heads)
        z_hand = torch.einsum("bhqk,bkhd->bqhd", pattern, v_heads)
        worst.see(rel(v, v_hand), f"layer {l}: hook_v = ln1(resid_pre) W_V + b_V")
        worst.see(rel(get(box, N.z(l)), z_hand), f"layer {l}: z = pattern v")
    return worst.gap, (f"a head's output is not its pattern applied to its values as rs_interp reads them "
                       f"({worst.where})")


def scores(model: Model, box: dict) -> tuple[float, str]:
    cfg, worst = model.cfg, _Worst()
    if _backend.has_qk_norm(model):  # the score is then not bilinear in the stream: nothing to measure
        return float("inf"), ("the model normalises its queries and keys (use_qk_norm, or a q_norm in the attention): "
                              "the score is not a bilinear form of the stream, so no reading of it from the weights is "
                              "the model's")
    for l in range(cfg.n_layers):
        q = _projected(model, box, l, "q", cfg.n_heads)
        k = _projected(model, box, l, "k", get(box, N.k(l)).shape[2])
        if cfg.positional_embedding_type == "rotary":
            q = _backend.apply_rotary(model, l, q.to(cfg.dtype)).to(q.dtype)
            k = _backend.apply_rotary(model, l, k.to(cfg.dtype)).to(k.dtype)
        s = torch.einsum("bqhd,bkhd->bhqk", q, _per_query_head(k, cfg.n_heads)) / _backend.attn_scale(model, l)
        P = s.shape[-1]
        A = s.masked_fill(torch.ones(P, P, dtype=torch.bool, device=s.device).triu(1), float("-inf")).softmax(-1)
        worst.see(rel(get(box, N.pattern(l)), A), f"layer {l}")
    return worst.gap, (f"a pattern is not the causal softmax of the bilinear scores of ln1(resid_pre) W_Q + b_Q and "
                       "W_K + b_K "
                       f"({worst.where}): something else moves the score (a query/key norm, a soft-cap, a bias such as "
                       "ALiBi, a sliding window), so a reading of the score from the weights alone is not the model's")


def scores_read(model: Model, box: dict) -> tuple[float, str]:
    """Every layer's scores as :func:`rs_interp._backend.score_hooks` reads them (recorded in the clean run),
    softmaxed under the causal mask, against the pattern the run applies."""
    if "scores read missing" in box:
        raise Missing(box["scores read missing"])
    if "scores read error" in box:
        raise box["scores read error"]
    worst = _Worst()
    for l in range(model.cfg.n_layers):
        s = get(box, f"scores read {l}").to(compute_dtype(model))
        P = s.shape[-1]
        A = s.masked_fill(torch.ones(P, P, dtype=torch.bool, device=s.device).triu(1), float("-inf")).softmax(-1)
        worst.see(rel(A, get(box, N.pattern(l))), f"layer {l}")
    return worst.gap, (f"the scores rs_interp reads do not give the pattern the run applies ({worst.where}): "
                       "a hook on the pattern, a soft-cap or mask after the hook, or a window: "
                       "the scores read are not the run's")


def projections(model: Model, box: dict, layers: set[int]) -> tuple[float, str]:
    worst = _Worst()
    for l in sorted(layers):
        for which in "qkv":
            got = get(box, N.projection(l, which))
            worst.see(rel(got, _projected(model, box, l, which, got.shape[2])), f"layer {l}'s hook_{which}")
    return worst.gap, (f"a projection is not ln1(resid_pre) W + b ({worst.where}): a head's q/k/v built or "
                       "differentiated by hand "
                         "(edge estimates, circuit evaluation) would miss what changes it")


def mlp_reads(model: Model, box: dict) -> tuple[float, str]:
    cfg, worst = model.cfg, _Worst()
    parallel = bool(getattr(cfg, "parallel_attn_mlp", False))
    for l in range(cfg.n_layers):
        x = get(box, N.resid_pre(l) if parallel else N.resid_mid(l))
        worst.see(rel(get(box, f"mlp_in {l}"), _normed(model, l, "ln2", x)), f"layer {l}")
    return worst.gap, (f"an MLP does not read ln2 of the stream before it ({worst.where}): what a transcoder reads at "
                       "ln2.hook_normalized or hook_resid_mid is not the MLP's input (a hook on the way, or a norm the "
                       "model places elsewhere)")


def mlp_writes(model: Model, box: dict) -> tuple[float, str]:
    worst = _Worst()
    for l in range(model.cfg.n_layers):
        written = get(box, N.mlp_out(l))
        worst.see(rel(written, get(box, f"mlp_write {l}")), f"layer {l}: a hook on hook_mlp_out")
        post = _backend.post_norms(model, l)[1]  # post-norm blocks: the norm after the MLP, as the model computes it
        dt = compute_dtype(model)
        own = post.to(dt).apply(get(box, f"mlp_out {l}").to(dt))
        worst.see(rel(written, own), f"layer {l}: between the MLP module and hook_mlp_out")
    return worst.gap, (f"what enters the stream is not the MLP's own output ({worst.where} changes it; or a norm after "
                       "the MLP): a feature's write through a transcoder would miss that change")


def _act(cfg) -> Callable[[torch.Tensor], torch.Tensor]:
    from transformer_lens.utilities.activation_functions import SUPPORTED_ACTIVATIONS

    if cfg.act_fn in (None, "solu_ln") or cfg.act_fn not in SUPPORTED_ACTIVATIONS:
        raise ValueError(f"no by-hand form of the MLP activation {cfg.act_fn!r} (solu_ln has a norm inside)")
    return SUPPORTED_ACTIVATIONS[cfg.act_fn]


def mlp_weights(model: Model, box: dict) -> tuple[float, str]:
    cfg, worst, dt = model.cfg, _Worst(), compute_dtype(model)
    act = _act(cfg)
    for l in range(cfg.n_layers):
        mlp = model.blocks[l].mlp
        x = get(box, f"mlp_in {l}").to(dt)
        # a bridge over a bias-free Hugging Face MLP (Llama's) has no b_in / b_out: zero
        w = {n: (p.detach().to(dt) if (p := getattr(mlp, n, None)) is not None else 0.0)
             for n in ("W_in", "b_in", "W_out", "b_out")}
        if getattr(cfg, "gated_mlp", False):
            gate = act(x @ mlp.W_gate.detach().to(dt))
            hidden = (gate * (x @ w["W_in"]) + w["b_in"] if _backend.GATED_B_IN_AFTER_PRODUCT
                      else gate * (x @ w["W_in"] + w["b_in"]))
        else:
            hidden = act(x @ w["W_in"] + w["b_in"])
        worst.see(rel(get(box, f"mlp_out {l}"), hidden @ w["W_out"] + w["b_out"]), f"layer {l}")
    return worst.gap, (f"an MLP's output is not its weights' function of its input ({worst.where}): a hook inside it, "
                       "or a form rs_interp does not know; its neurons are not an exact transcoder")


def readout_by_hand(model: Model, final: torch.Tensor) -> torch.Tensor:
    """``softcap(final_norm(final) W_U + b_U)`` in the compute dtype, the norm by hand."""
    return readout(model, final, compute_dtype(model))


def readout_check(model: Model, box: dict) -> tuple[float, str]:
    final = get(box, N.final_stream(model.cfg.n_layers))
    cap = logit_softcap(model)
    return rel(box["logits"], readout_by_hand(model, final)), (
        "the logits are not the unembedding of the final norm of the final stream"
        + ("" if cap is None else f" with the soft-cap {cap:g}") + " (a step after the unembedding, or a norm "
                                                                   "rs_interp does not read)")


def vocabulary(model: Model, box: dict) -> tuple[float, str]:
    sizes = {"the logits": box["logits"].shape[-1], "W_U": model.W_U.shape[-1], "cfg.d_vocab_out": d_vocab_out(model)}
    if len(set(sizes.values())) == 1:
        return 0.0, ""
    return float("inf"), ("the output vocabulary is not one size (" + ", ".join(f"{k} {v}" for k, v in sizes.items())
                          + "): a target id could index another token than the logit it names")
