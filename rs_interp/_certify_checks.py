"""The measurements behind :func:`rs_interp.certify`: one clean run, one perturbed run with gradients,
and the runs from and to each layer, on a probe batch; each identity of
:data:`rs_interp.certificate.IDENTITIES` is a relative gap against the tolerance."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from . import _backend
from ._backend import Model, attn_weight, logit_softcap, norm_affine, run_from
from ._stream import RESID0, Reader, reader_gradients, readers, watched
from .hooks import store_matching

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
        name: its key in :data:`IDENTITIES`.
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


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """``max |a - b| / max |b|`` in float64 (0 when both are 0)."""
    a, b = a.detach().to(torch.float64), b.detach().to(torch.float64)
    if a.shape != b.shape:
        return float("inf")
    scale = float(b.abs().max()) if b.numel() else 0.0
    gap = float((a - b).abs().max()) if b.numel() else 0.0
    return gap / scale if scale > 0 else (0.0 if gap == 0 else float("inf"))


def _probe(model: Model) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    B, P = _PROBE[0], min(_PROBE[1], model.cfg.n_ctx)
    return torch.randint(0, model.cfg.d_vocab, (B, P), generator=g).to(model.cfg.device)


class _Missing(Exception):
    """A hook point an identity reads is absent."""


def _get(box: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    if name not in box:
        raise _Missing(name)
    return box[name]


def _judge(name: str, tol: float, fn: Callable[[], tuple[float, str]], applies: bool = True) -> Identity:
    """Run one check: ``fn`` returns (relative gap, what fails where the gap is over ``tol``); an
    exception or a missing hook point fails the identity, named."""
    if not applies:
        return Identity(name, None, float("nan"), tol)
    try:
        gap, why = fn()
    except _Missing as err:
        return Identity(name, False, float("nan"), tol, f"the model has no hook point {err.args[0]}")
    except MODEL_ERRORS as err:  # the model's own modules: an error there means the identity cannot hold
        return Identity(name, False, float("nan"), tol, f"{type(err).__name__}: {str(err)[:160]}")
    ok = gap <= tol
    return Identity(name, ok, gap, tol, "" if ok else why)


def _norm(model: Model, module: torch.nn.Module | None, x: torch.Tensor, what: str) -> torch.Tensor:
    """The norm ``module`` applied to ``x`` by hand from :func:`rs_interp._backend.norm_affine`, in float64."""
    if model.cfg.normalization_type is None:
        return x.to(torch.float64)
    if module is None:
        raise ValueError(f"{what}: the model has no such norm (the config says {model.cfg.normalization_type})")
    kind, gain, bias, eps = norm_affine(model, module)
    x = x.to(torch.float64)
    if kind in ("LN", "LNPre"):
        x = x - x.mean(-1, keepdim=True)
    x = x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    if gain is not None:
        x = x * gain.detach().to(torch.float64)
    if bias is not None:
        x = x + bias.detach().to(torch.float64)
    return x


def _clean_run(model: Model, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    wanted = ("hook_embed", "hook_pos_embed", "hook_resid_pre", "hook_resid_mid", "hook_attn_out", "hook_mlp_in",
              "hook_mlp_out", "hook_resid_post", "attn.hook_z", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_pattern")
    box: dict[str, torch.Tensor] = {}
    if model.cfg.attn_only:  # hook_mlp_in exists but may not be switched on
        wanted = tuple(w for w in wanted if w != "hook_mlp_in")
    with torch.no_grad(), model.hooks(fwd_hooks=store_matching(box, model, lambda n: n.endswith(wanted))):
        try:
            logits = model(tokens, return_type="logits")
        except MODEL_ERRORS as err:
            if any(hp._forward_hooks for hp in model.hook_dict.values()):
                raise  # hooks are attached: theirs may be the error, and it is the caller's to see
            raise ValueError(f"the model's forward pass raises {type(err).__name__} on a probe batch "
                             f"({str(err)[:200]}): rs_interp cannot check or use it in dtype {model.cfg.dtype}; "
                             "try another dtype (e.g. torch.float32) or the other TransformerLens version") from err
    box["logits"] = logits
    return box


def _embedding(model: Model, box: dict) -> tuple[float, str]:
    want = _get(box, "hook_embed")
    if model.cfg.positional_embedding_type == "standard":
        want = want + _get(box, "hook_pos_embed")
    return _rel(_get(box, RESID0), want), ("the stream entering block 0 is not the token (and learned position) embedding: "
                                            "something between them (an embedding norm or scale) is not a component")


def _stream(model: Model, box: dict) -> tuple[float, str]:
    cfg, worst, where = model.cfg, 0.0, ""
    parallel = bool(getattr(cfg, "parallel_attn_mlp", False))
    for l in range(cfg.n_layers):
        b = f"blocks.{l}."
        pre, attn, post = _get(box, b + "hook_resid_pre"), _get(box, b + "hook_attn_out"), _get(box, b + "hook_resid_post")
        if cfg.attn_only:
            pairs = [(post, pre + attn, "resid_pre + attn_out = resid_post")]
        elif parallel:
            pairs = [(post, pre + attn + _get(box, b + "hook_mlp_out"), "resid_pre + attn_out + mlp_out = resid_post")]
        else:
            mid = _get(box, b + "hook_resid_mid")
            pairs = [(mid, pre + attn, "resid_pre + attn_out = resid_mid"), (post, mid + _get(box, b + "hook_mlp_out"),
                                                                              "resid_mid + mlp_out = resid_post")]
        if l + 1 < cfg.n_layers:
            pairs.append((_get(box, f"blocks.{l + 1}.hook_resid_pre"), post, "resid_post = the next resid_pre"))
        for lhs, rhs, what in pairs:
            gap = _rel(lhs, rhs)
            if gap > worst:
                worst, where = gap, f"layer {l}: {what}"
    return worst, (f"the stream does not add up ({where}): a block changes what its sublayers write before adding it "
                   "(a norm after a sublayer?) or the config's block form is not the model's")


def _values(model: Model, box: dict) -> tuple[float, str]:
    cfg, worst, where = model.cfg, 0.0, ""
    for l in range(cfg.n_layers):
        block, attn = model.blocks[l], model.blocks[l].attn
        x = _norm(model, getattr(block, "ln1", None), _get(box, f"blocks.{l}.hook_resid_pre"), f"layer {l}'s ln1")
        v = _get(box, f"blocks.{l}.attn.hook_v").to(torch.float64)
        W_V, b_V = attn_weight(attn, "W_V", cfg.n_heads), attn_weight(attn, "b_V", cfg.n_heads)
        if v.shape[2] != cfg.n_heads:  # one value per KV head
            step = cfg.n_heads // v.shape[2]
            W_V, b_V = W_V[::step], b_V[::step]
        v_hand = torch.einsum("bpm,hmd->bphd", x, W_V.detach().to(torch.float64)) + b_V.detach().to(torch.float64)
        A = _get(box, f"blocks.{l}.attn.hook_pattern").to(torch.float64)
        v_q = v.repeat_interleave(cfg.n_heads // v.shape[2], dim=2)
        z_hand = torch.einsum("bhqk,bkhd->bqhd", A, v_q)
        for gap, what in ((_rel(v, v_hand), "hook_v = ln1(resid_pre) W_V + b_V"), (_rel(_get(box, f"blocks.{l}.attn.hook_z"), z_hand),
                                                                                     "z = pattern v")):
            if gap > worst:
                worst, where = gap, f"layer {l}: {what}"
    return worst, f"a head's output is not its pattern applied to its values as rs_interp reads them ({where})"


def _projections(model: Model, box: dict, layers: set[int]) -> tuple[float, str]:
    cfg, worst, where = model.cfg, 0.0, ""
    for l in sorted(layers):
        x = _norm(model, getattr(model.blocks[l], "ln1", None), _get(box, f"blocks.{l}.hook_resid_pre"), f"layer {l}'s ln1")
        for which in "qkv":
            got = _get(box, f"blocks.{l}.attn.hook_{which}").to(torch.float64)
            W = attn_weight(model.blocks[l].attn, f"W_{which.upper()}", cfg.n_heads)
            b = attn_weight(model.blocks[l].attn, f"b_{which.upper()}", cfg.n_heads)
            if got.shape[2] != cfg.n_heads:
                step = cfg.n_heads // got.shape[2]
                W, b = W[::step], b[::step]
            gap = _rel(got, torch.einsum("bpm,hmd->bphd", x, W.detach().to(torch.float64)) + b.detach().to(torch.float64))
            if gap > worst:
                worst, where = gap, f"layer {l}'s hook_{which}"
    return worst, f"a projection is not ln1(resid_pre) W + b ({where}): its input gradient cannot be taken back by hand"


def readout_by_hand(model: Model, final: torch.Tensor) -> torch.Tensor:
    """``softcap(final_norm(final) W_U + b_U)`` in float64, the norm by hand."""
    x = _norm(model, getattr(model, "ln_final", None), final, "the final norm")
    logits = x @ model.W_U.detach().to(torch.float64)
    b_U = getattr(model, "b_U", None)
    if b_U is not None:
        logits = logits + b_U.detach().to(torch.float64)
    cap = logit_softcap(model)
    return logits if cap is None else cap * torch.tanh(logits / cap)


def _readout(model: Model, box: dict) -> tuple[float, str]:
    final = _get(box, f"blocks.{model.cfg.n_layers - 1}.hook_resid_post")
    gap = _rel(box["logits"], readout_by_hand(model, final))
    cap = logit_softcap(model)
    return gap, ("the logits are not the unembedding of the final norm of the final stream"
                 + ("" if cap is None else f" with the soft-cap {cap:g}") + " (a step after the unembedding, or a norm "
                 "rs_interp does not read)")


def _start(model: Model, tokens: torch.Tensor, box: dict) -> tuple[float, str]:
    worst, where = 0.0, ""
    spe = box.get("hook_pos_embed") if model.cfg.positional_embedding_type == "shortformer" else None
    with torch.no_grad():
        for l in range(model.cfg.n_layers):
            gap = _rel(run_from(model, _get(box, f"blocks.{l}.hook_resid_pre"), start=l, spe=spe), box["logits"])
            if gap > worst:
                worst, where = gap, f"from layer {l}"
    return worst, (f"running from a layer does not reproduce the full run ({where}): TransformerLens's start_at_layer "
                   "misses a step of this architecture (the scan and path patching then run every pass from the tokens)")


def _stop(model: Model, tokens: torch.Tensor, box: dict) -> tuple[float, str]:
    L = model.cfg.n_layers
    with torch.no_grad():
        gap = _rel(run_from(model, tokens, stop=L), _get(box, f"blocks.{L - 1}.hook_resid_post"))
    return gap, "stop_at_layer=n_layers does not return the final stream"


def _gradient_run(model: Model, tokens: torch.Tensor, tol: float) -> dict[str, Identity]:
    """The perturbed run: every head's z moved (the heads identity then shows it is on the forward path),
    and the gradient of a random linear function of the logits at every reader and every resid_pre."""
    cfg, L = model.cfg, model.cfg.n_layers
    g = torch.Generator().manual_seed(1)
    box: dict[str, torch.Tensor] = {}
    grads: dict[str, torch.Tensor] = {}
    by_reader: dict[tuple[int, str], torch.Tensor] = {}
    fired: set[str] = set()

    def perturb(name: str) -> Callable:  # keyed by the name asked (4.x hands a hook its canonical name)
        def fn(z: torch.Tensor, *, hook) -> torch.Tensor:
            d = torch.randn(z.shape, generator=g, dtype=torch.float64).to(z.dtype) * (0.5 * float(z.detach().abs().mean()) + 1e-3)
            out = z + d
            box[name] = out.detach()

            def save(grad: torch.Tensor) -> None:
                grads[name] = grad.detach().to(torch.float64)
            return watched(out, save)
        return fn

    def keep(name: str) -> Callable:
        def fn(t: torch.Tensor, *, hook) -> None:
            box[name] = t.detach()
        return fn

    def watch(name: str) -> Callable:
        def fn(t: torch.Tensor, *, hook) -> torch.Tensor:
            def save(grad: torch.Tensor) -> None:
                grads[name] = grad.detach().to(torch.float64)
            return watched(t, save)
        return fn

    def on_grad(reader: Reader, G: torch.Tensor) -> None:
        fired.add(reader.kind)
        fired.add((reader.layer, reader.kind))
        key = (reader.layer, "logits" if reader.kind == "logits" else "layer")
        total = G.sum(1)
        by_reader[key] = by_reader.get(key, 0) + total

    wanted = readers(model, projected=False)
    names = set(model.hook_dict)
    missing = sorted({r.hook for r in wanted if r.hook.split(".")[-1] in ("hook_mlp_in", "hook_resid_post") and r.hook not in names})
    fwd = [(n, perturb(n)) for n in (f"blocks.{l}.attn.hook_z" for l in range(L))]
    fwd += [(n, keep(n)) for n in (f"blocks.{l}.hook_attn_out" for l in range(L))]
    fwd += [(f"blocks.{l}.hook_resid_pre", watch(f"pre{l}")) for l in range(L)]
    out: dict[str, Identity] = {}
    def run(with_readers: bool) -> None:
        box.clear(), grads.clear(), by_reader.clear(), fired.clear()
        g.manual_seed(1)
        with torch.enable_grad():
            leaf = torch.zeros((), dtype=cfg.dtype, requires_grad=True)
            hooks = [("hook_embed", lambda t, *, hook: t + leaf)] + fwd
            absent = sorted({n for n, _ in hooks if n not in names})
            if absent:
                raise _Missing(absent[0])
            with reader_gradients(model, wanted if with_readers else [], on_grad, extra=hooks) as runnable, \
                    model.hooks(fwd_hooks=runnable):
                logits = model(tokens, return_type="logits")
                R = torch.randn(logits.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64).to(logits.device)
                (logits.to(torch.float64) * R).sum().div(R.numel()).backward(inputs=[leaf])

    def failed(err: Exception) -> str:
        return f"the model has no hook point {err.args[0]}" if isinstance(err, _Missing) else f"{type(err).__name__}: {str(err)[:200]}"

    readers_failed = None
    try:
        if missing:
            raise _Missing(missing[0])
        run(True)
    except (_Missing, *MODEL_ERRORS) as err:  # the readers' hooks: measure the rest without them
        readers_failed = failed(err)
        try:
            run(False)
        except (_Missing, *MODEL_ERRORS) as err2:
            for name in ("z", "heads", "input", "readers"):
                out[name] = Identity(name, False, float("nan"), tol, f"the run with gradients failed: {failed(err2)}")
            return out

    def heads() -> tuple[float, str]:
        worst, where = 0.0, ""
        for l in range(L):
            attn = model.blocks[l].attn
            z = _get(box, f"blocks.{l}.attn.hook_z").to(torch.float64)
            want = torch.einsum("bphd,hdm->bpm", z, attn.W_O.detach().to(torch.float64)) + attn_weight(attn, "b_O", cfg.n_heads).detach().to(torch.float64)
            gap = _rel(_get(box, f"blocks.{l}.hook_attn_out"), want)
            if gap > worst:
                worst, where = gap, f"layer {l}"
        return worst, (f"the heads' z W_O + b_O are not attn_out ({where}): a head's write is not what its z says "
                       "(a norm after the attention?)")

    def z_on_path() -> tuple[float, str]:
        # on the path iff its gradient is computed at all (0 is a gradient: a head nothing downstream reads)
        for l in range(L):
            if f"blocks.{l}.attn.hook_z" not in grads:
                return float("inf"), f"blocks.{l}.attn.hook_z is not on the forward path: no gradient reaches it"
        return 0.0, ""

    def input_on_path() -> tuple[float, str]:
        return (0.0 if "pre0" in grads else float("inf")), "blocks.0.hook_resid_pre is not on the forward path: no gradient reaches it"

    def complete() -> tuple[float, str]:
        for kind, hook in (("mlp", "hook_mlp_in"), ("q", "hook_q_input ... hook_v_input")):
            if (kind == "q" or not cfg.attn_only) and kind not in fired:
                return float("inf"), (f"this model's {hook} is not on the forward path (no gradient reaches it): edges into "
                                      f"{'MLPs' if kind == 'mlp' else 'heads'} cannot be patched or estimated")
        worst, where = 0.0, ""
        for l in range(L):
            if f"pre{l}" not in grads:
                return float("inf"), f"blocks.{l}.hook_resid_pre is not on the forward path"
            if not cfg.attn_only and (l, "mlp") not in fired:
                return float("inf"), (f"this model's blocks.{l}.hook_mlp_in is not on the forward path (no gradient reaches it): "
                                      "edges into MLPs cannot be patched or estimated")
            nxt = grads.get(f"pre{l + 1}") if l + 1 < L else by_reader.get((l, "logits"))
            if nxt is None:
                return float("inf"), f"the stream after layer {l} is not on the forward path"
            rhs = by_reader.get((l, "layer"), 0) + nxt.reshape(-1)
            gap = _rel(grads[f"pre{l}"].reshape(-1), rhs)
            if gap > worst:
                worst, where = gap, f"layer {l}"
        return worst, (f"the receivers' gradients miss the stream's at {where}: some reader of the stream is not one of the "
                       "graph's receivers (a norm after a sublayer, an input the hooks do not see)")

    out["z"] = _judge("z", tol, z_on_path)
    out["heads"] = _judge("heads", tol, heads)
    out["input"] = _judge("input", tol, input_on_path)
    out["readers"] = (_judge("readers", tol, complete) if readers_failed is None
                      else Identity("readers", False, float("nan"), tol, f"the receivers cannot be read: {readers_failed}"))
    return out


def measure(model: Model, tol: float) -> dict[str, Identity]:
    """Every identity of :data:`rs_interp.certificate.IDENTITIES` on ``model`` (flags already set by the caller).

    Raises:
        ValueError: the model's forward pass fails on the probe batch (named).
    """
    tokens = _probe(model)
    box = _clean_run(model, tokens)
    cfg = model.cfg
    projected = _backend.projection_layers(model)
    out = {
        "embedding": _judge("embedding", tol, lambda: _embedding(model, box)),
        "stream": _judge("stream", tol, lambda: _stream(model, box)),
        "values": _judge("values", tol, lambda: _values(model, box)),
        "projections": _judge("projections", tol, lambda: _projections(model, box, projected), applies=bool(projected)),
        "readout": _judge("readout", tol, lambda: _readout(model, box)),
        "start at layer": _judge("start at layer", tol, lambda: _start(model, tokens, box)),
        "stop at layer": _judge("stop at layer", tol, lambda: _stop(model, tokens, box)),
    }
    out.update(_gradient_run(model, tokens, tol))
    if cfg.n_layers == 0:  # nothing to read: every identity is vacuous
        out = {k: Identity(k, None, float("nan"), tol) for k in out}
    return out
