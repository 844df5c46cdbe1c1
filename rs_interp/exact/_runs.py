"""The identities that need runs of their own, and :func:`measure`, which the certificate calls: the
perturbed run with gradients (``z``, ``heads``, ``input``, ``readers``), the stacked and single-row runs
(``rows``), the runs with one head's input moved (``head inputs``), and the runs from and to each layer
(``start at layer``, ``stop at layer``). The identities read off the clean run are :mod:`rs_interp.exact._checks`."""

from __future__ import annotations

from typing import Callable

import torch

from .. import _backend
from .. import _names as N
from .._backend import Model, run_from
from . import _checks as C
from ._checks import MODEL_ERRORS, Identity, Missing, get, judge, rel
from .postnorm import frozen_heads
from .stream import Reader, reader_gradients, readers, routed, watched, zero_leaf

__all__: list[str] = []


def _start(model: Model, box: dict) -> tuple[float, str]:
    """The run from each layer's clean stream to the logits, as the helpers call it
    (:func:`rs_interp._backend.run_from`: on 4.x the blocks from that layer alone), against the full run."""
    worst = C._Worst()
    spe = box.get(N.POS_EMBED) if model.cfg.positional_embedding_type == "shortformer" else None
    with torch.no_grad():
        for l in range(model.cfg.n_layers):
            worst.see(rel(run_from(model, get(box, N.resid_pre(l)), start=l, spe=spe), box["logits"]), f"from layer {l}")
    return worst.gap, (f"running from a layer does not reproduce the full run ({worst.where}): TransformerLens's start_at_layer "
                       "misses a step of this architecture (the scan and path patching then run every pass from the tokens)")


def _stop(model: Model, tokens: torch.Tensor, box: dict) -> tuple[float, str]:
    L, worst = model.cfg.n_layers, C._Worst()
    with torch.no_grad():
        for l in sorted({L // 2, L}):  # the helpers run to the end (the lenses, the scan's readout); one layer inside too
            want = get(box, N.resid_pre(l) if l < L else N.final_stream(L))
            worst.see(rel(run_from(model, tokens, stop=l), want), f"stop_at_layer={l}")
    return worst.gap, (f"running to a layer does not return the stream there ({worst.where}): the lenses and the scan's "
                       "readout at chosen positions read the stream it returns")


#: (rows, positions) of the rows probe: more rows than two, so that a hook on one row index (or on the rows past
#: one) moves under the permutation, and more positions than the identities' probe.
_ROWS_PROBE = (4, 12)


def _rows(model: Model) -> tuple[float, str]:
    """A batch of its own, against the same rows permuted and stacked after another row, its first row
    alone and its first two rows: a helper that stacks copies of a batch along the batch axis needs each
    row to give what it gives alone. A hook that edits a row by index, reads the batch as a whole (a mean)
    or depends on the batch's size moves a row in one of them. (A hook that acts only past these sizes
    cannot be seen by any probe: the docs say so.)"""
    R, P = _ROWS_PROBE
    tokens = C.probe(model, seed=5, batch=R, pos=P)
    other = C.probe(model, seed=3, batch=1, pos=tokens.shape[1])
    perm = torch.arange(R).roll(1)  # every row moves
    worst = C._Worst()
    with torch.no_grad():
        logits = model(tokens, return_type="logits")
        stacked = model(torch.cat([other, tokens[perm]]), return_type="logits")[1:]
        worst.see(rel(stacked, logits[perm]), "permuted and stacked after another row")
        worst.see(rel(model(tokens[:1], return_type="logits"), logits[:1]), "row 0 alone")
        worst.see(rel(model(tokens[:2], return_type="logits"), logits[:2]), "rows 0 and 1 alone")
    return worst.gap, (f"a row's logits depend on the other rows of its batch ({worst.where} differs): a hook that reads or "
                       "edits the batch as a whole (one prompt by index, a batch mean) is attached; helpers that stack "
                       "passes along the batch run one pass per ablation or edge instead")


def _scores_read(model: Model, tokens: torch.Tensor, box: dict) -> tuple[float, str]:
    """Every layer's scores as :func:`rs_interp._backend.score_hooks` reads them, softmaxed under the causal
    mask, against the pattern the run applies."""
    got: dict[str, torch.Tensor] = {}
    hooks = [h for l in range(model.cfg.n_layers) for h in _backend.score_hooks(model, l, got, f"s {l}")]
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        model(tokens, return_type="logits")
    worst = C._Worst()
    for l in range(model.cfg.n_layers):
        s = get(got, f"s {l}").to(torch.float64)
        P = s.shape[-1]
        A = s.masked_fill(torch.ones(P, P, dtype=torch.bool, device=s.device).triu(1), float("-inf")).softmax(-1)
        worst.see(rel(A, get(box, N.pattern(l))), f"layer {l}")
    return worst.gap, (f"the scores rs_interp reads do not give the pattern the run applies ({worst.where}): a hook on the "
                       "pattern, a soft-cap or mask after the hook, or a window: the scores read are not the run's")


def _head_inputs(model: Model, tokens: torch.Tensor, box: dict) -> tuple[float, str]:
    """For each of q, k and v, one pass through the per-head inputs (:func:`rs_interp.exact.stream.routed`) with
    every layer's first head's (or KV head's) input moved and the stream entering each layer pinned to the clean
    run's: every head that does not read the moved input must keep its output (``hook_z``) the clean run's. A norm
    across the heads' queries after the split (OLMo-2's ``q_norm``, were it not applied to each head's own copy)
    or a hook that reads across the heads moves them."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    g = torch.Generator().manual_seed(11)
    worst = C._Worst()
    for x in "qkv":
        got: dict[int, torch.Tensor] = {}
        slots: dict[int, int] = {}

        def pin(l: int) -> Callable:  # keyed by layer: 4.x calls a hook by its alias
            return lambda t, *, hook: get(box, N.resid_pre(l)).to(t.dtype)

        def move(l: int) -> Callable:
            def fn(t: torch.Tensor, *, hook) -> torch.Tensor:
                slots[l] = t.shape[2]
                d = torch.randn(t[:, :, 0].shape, generator=g, dtype=torch.float64).to(t.dtype)
                d = d * float(t.detach().abs().mean())
                t = t.clone()
                t[:, :, 0] = t[:, :, 0] + d
                return t
            return fn

        def keep(l: int) -> Callable:
            return lambda t, *, hook: got.__setitem__(l, t.detach())

        fwd = [(N.resid_pre(l), pin(l)) for l in range(L)] + [(N.qkv_input(l, x), move(l)) for l in range(L)]
        fwd += [(N.z(l), keep(l)) for l in range(L)]
        with torch.no_grad(), routed(model, fwd, split=True) as runnable, model.hooks(fwd_hooks=runnable):
            model(tokens, return_type="logits")
        for l in range(L):
            n = slots.get(l)
            if n is None or l not in got:
                raise Missing(N.qkv_input(l, x) if n is None else N.z(l))
            others = [h for h in range(H) if h // (H // n) != 0]  # the heads that read another input than slot 0's
            if others:
                worst.see(rel(got[l][:, :, others], get(box, N.z(l))[:, :, others]), f"layer {l}'s hook_{x}_input")
    return worst.gap, (f"moving one head's input moves other heads' outputs ({worst.where}): something across "
                       "the heads (a norm over every head's queries or keys, or a hook reading the heads together) "
                       "carries it, so an edge into one head would move the others")


def _backward_hooks(model: Model) -> list[tuple[dict, dict]]:
    """Every backward hook that could change a gradient: (the dict it lives in, a copy) for each module's
    backward and backward-pre hooks (the bridge's own wiring left out) and PyTorch's global ones."""
    import torch.nn.modules.module as M

    found = []
    for module in model.modules():
        for d in ("_backward_pre_hooks", "_backward_hooks"):
            hooks = getattr(module, d, None)
            if hooks and any(not _backend.is_own_hook(fn) for fn in hooks.values()):
                found.append((hooks, dict(hooks)))
    for d in ("_global_backward_pre_hooks", "_global_backward_hooks"):
        hooks = getattr(M, d, None)
        if hooks:
            found.append((hooks, dict(hooks)))
    return found


def _gradients(model: Model, tokens: torch.Tensor) -> tuple[float, str]:
    """The gradient of a fixed projection of the logits at every block's input and the final stream, with
    the backward hooks attached and with them set aside: equal where no hook changes a gradient (a hook
    that only records passes). Without backward hooks there is nothing to measure."""
    attached = _backward_hooks(model)
    if not attached:
        return 0.0, ""
    L = model.cfg.n_layers
    points = [N.resid_pre(l) for l in range(L)] + [N.final_stream(L)]
    g = torch.Generator().manual_seed(7)

    def grads() -> dict[str, torch.Tensor]:
        got: dict[str, torch.Tensor] = {}

        def keep(name: str) -> Callable:
            def fn(t: torch.Tensor, hook) -> torch.Tensor:  # keyed by our name: 4.x calls a hook by its alias
                if not t.requires_grad:  # frozen weights: make the stream a leaf of the graph
                    t = t.detach().requires_grad_(True)
                t.register_hook(lambda grad: got.__setitem__(name, grad.detach().clone()))
                return t
            return fn

        with torch.enable_grad(), model.hooks(fwd_hooks=[(p, keep(p)) for p in points]):
            logits = model(tokens, return_type="logits")
            w = torch.randn(logits.shape, generator=g, dtype=torch.float64).to(logits.device, logits.dtype)
            (logits * w).sum().backward()
        model.zero_grad(set_to_none=True)
        return got

    with_hooks = grads()
    g.manual_seed(7)
    try:
        for hooks, _ in attached:
            hooks.clear()
        without = grads()
    finally:
        for hooks, saved in attached:
            hooks.update(saved)
    worst = C._Worst()
    for name in points:
        worst.see(rel(get(with_hooks, name), get(without, name)), name)
    return worst.gap, (f"a backward hook changes the gradients ({worst.where}): the gradient helpers would differentiate "
                       "something other than the model's function")


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

    def on_grad(reader: Reader, fill: Callable[[torch.Tensor], None]) -> None:
        buf = torch.empty(len(reader.labels), tokens.numel() * cfg.d_model, dtype=torch.float64)
        fill(buf)
        G = buf.T
        fired.add(reader.kind)
        fired.add((reader.layer, reader.kind))
        key = (reader.layer, "logits" if reader.kind == "logits" else "layer")
        total = G.sum(1)
        by_reader[key] = by_reader.get(key, 0) + total

    wanted = readers(model, projected=False)
    names = set(model.hook_dict)
    missing = sorted({r.hook for r in wanted if r.kind in ("mlp", "logits") and r.hook not in names})
    fwd = [(n, perturb(n)) for n in (N.z(l) for l in range(L))]
    fwd += [(n, keep(n)) for n in (N.attn_out(l) for l in range(L))]
    fwd += [(N.resid_pre(l), watch(f"pre{l}")) for l in range(L)]
    out: dict[str, Identity] = {}
    logits_of: dict[bool, torch.Tensor] = {}  # per run, with the readers' (per-head) inputs or without

    def run(with_readers: bool) -> None:
        box.clear(), grads.clear(), by_reader.clear(), fired.clear()
        g.manual_seed(1)
        with torch.enable_grad():
            leaf, at_embed = zero_leaf(model)
            hooks = [at_embed] + fwd
            absent = sorted({n for n, _ in hooks if n not in names})
            if absent:
                raise Missing(absent[0])
            with reader_gradients(model, wanted if with_readers else [], on_grad, torch.float64, extra=hooks) as runnable, \
                    model.hooks(fwd_hooks=runnable):
                logits = model(tokens, return_type="logits")
                logits_of[with_readers] = logits.detach().to(torch.float64)
                R = torch.randn(logits.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64).to(logits.device)
                (logits.to(torch.float64) * R).sum().div(R.numel()).backward(inputs=[leaf])

    def failed(err: Exception) -> str:
        return f"the model has no hook point {err.args[0]}" if isinstance(err, Missing) else f"{type(err).__name__}: {str(err)[:200]}"

    readers_failed = None
    try:
        if missing:
            raise Missing(missing[0])
        run(False)  # the model's own run, which the run through the per-head inputs must reproduce (complete)
        run(True)
    except (Missing, *MODEL_ERRORS) as err:  # the readers' hooks: measure the rest without them
        readers_failed = failed(err)
        try:
            run(False)
        except (Missing, *MODEL_ERRORS) as err2:
            for name in ("z", "heads", "input", "readers"):
                out[name] = Identity(name, False, float("nan"), tol, f"the run with gradients failed: {failed(err2)}")
            return out

    def heads() -> tuple[float, str]:
        worst, where = 0.0, ""
        for l in range(L):
            per_head, bias = frozen_heads(model, l, get(box, N.z(l)), torch.float64)  # z W_O (post-norm: scale frozen)
            gap = rel(get(box, N.attn_out(l)), per_head.sum(0) + bias)
            if gap > worst:
                worst, where = gap, f"layer {l}"
        post = " through the post-attention norm, its scale frozen," if _backend.has_post_norms(model) else ""
        return worst, (f"the heads' z W_O + b_O{post} are not attn_out ({where}): a head's write is not what its z says "
                       "(a norm after the attention that rs_interp does not read?)")

    def z_on_path() -> tuple[float, str]:
        # on the path iff its gradient is computed at all (0 is a gradient: a head nothing downstream reads)
        for l in range(L):
            if N.z(l) not in grads:
                return float("inf"), f"{N.z(l)} is not on the forward path: no gradient reaches it"
        return 0.0, ""

    def input_on_path() -> tuple[float, str]:
        return (0.0 if "pre0" in grads else float("inf")), f"{N.RESID0} is not on the forward path: no gradient reaches it"

    def complete() -> tuple[float, str]:
        split = rel(logits_of[True], logits_of[False])  # e.g. a hook on a q/k/v projection module the split inputs bypass
        if split > tol:
            return split, ("the run through the per-head inputs (hook_q_input ... hook_v_input) gives other logits than the "
                           "model's own run: something the model computes on the way to q, k, v (a hook or a replaced "
                           "forward on a projection module) is not computed there, so edges into heads would be another model's")
        for kind, hook in (("mlp", "hook_mlp_in"), ("q", "hook_q_input ... hook_v_input")):
            if (kind == "q" or not cfg.attn_only) and kind not in fired:
                return float("inf"), (f"this model's {hook} is not on the forward path (no gradient reaches it): edges into "
                                      f"{'MLPs' if kind == 'mlp' else 'heads'} cannot be patched or estimated")
        worst, where = 0.0, ""
        for l in range(L):
            if f"pre{l}" not in grads:
                return float("inf"), f"{N.resid_pre(l)} is not on the forward path"
            if not cfg.attn_only and (l, "mlp") not in fired:
                return float("inf"), (f"this model's {N.mlp_in(l)} is not on the forward path (no gradient reaches it): "
                                      "edges into MLPs cannot be patched or estimated")
            nxt = grads.get(f"pre{l + 1}") if l + 1 < L else by_reader.get((l, "logits"))
            if nxt is None:
                return float("inf"), f"the stream after layer {l} is not on the forward path"
            rhs = by_reader.get((l, "layer"), 0) + nxt.reshape(-1)
            gap = rel(grads[f"pre{l}"].reshape(-1), rhs)
            if gap > worst:
                worst, where = gap, f"layer {l}"
        return worst, (f"the receivers' gradients miss the stream's at {where}: some reader of the stream is not one of the "
                       "graph's receivers (a norm after a sublayer, an input the hooks do not see)")

    out["z"] = judge("z", tol, z_on_path)
    out["heads"] = judge("heads", tol, heads)
    out["input"] = judge("input", tol, input_on_path)
    out["readers"] = (judge("readers", tol, complete) if readers_failed is None
                      else Identity("readers", False, float("nan"), tol, f"the receivers cannot be read: {readers_failed}"))
    return out


def measure(model: Model, tol: float) -> dict[str, Identity]:
    """Every identity of :data:`rs_interp.exact.certificate.IDENTITIES` but ``source`` on ``model`` (flags already
    set by the caller).

    Raises:
        ValueError: the model's forward pass fails on the probe batch (named).
    """
    tokens = C.probe(model)
    box = C.clean_run(model, tokens)
    cfg = model.cfg
    mlps = not cfg.attn_only
    projected = _backend.projection_layers(model)
    out = {
        "embedding": judge("embedding", tol, lambda: C.embedding(model, box)),
        "stream": judge("stream", tol, lambda: C.stream(model, box)),
        "values": judge("values", tol, lambda: C.values(model, box)),
        "scores": judge("scores", tol, lambda: C.scores(model, box)),
        "scores read": judge("scores read", tol, lambda: _scores_read(model, tokens, box)),
        "projections": judge("projections", tol, lambda: C.projections(model, box, projected), applies=bool(projected)),
        "mlp reads": judge("mlp reads", tol, lambda: C.mlp_reads(model, box), applies=mlps),
        "mlp writes": judge("mlp writes", tol, lambda: C.mlp_writes(model, box), applies=mlps),
        "mlp weights": judge("mlp weights", tol, lambda: C.mlp_weights(model, box), applies=mlps),
        "readout": judge("readout", tol, lambda: C.readout_check(model, box)),
        "vocabulary": judge("vocabulary", tol, lambda: C.vocabulary(model, box)),
        "rows": judge("rows", tol, lambda: _rows(model)),
        "head inputs": judge("head inputs", tol, lambda: _head_inputs(model, tokens, box)),
        "gradients": judge("gradients", tol, lambda: _gradients(model, tokens)),
        "start at layer": judge("start at layer", tol, lambda: _start(model, box)),
        "stop at layer": judge("stop at layer", tol, lambda: _stop(model, tokens, box)),
    }
    out.update(_gradient_run(model, tokens, tol))
    if cfg.n_layers == 0:  # nothing to read: every identity is vacuous
        out = {k: Identity(k, None, float("nan"), tol) for k in out}
    return out
