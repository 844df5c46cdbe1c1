"""The identities that need runs of their own, and :func:`measure`, which the certificate calls: the
run with every head's z moved (``heads``, and the reference of ``readers``), the run with gradients
(``z``, ``input``, ``readers``: one backward pass), the stacked and single-row runs (``rows``, against the clean
run's logits), the runs with the first head's inputs moved (``head inputs``), each block run from its cached input
(``start at layer``) and the
runs to a layer (``stop at layer``); the last four are written in :mod:`rs_interp.exact._layer_runs`. The
identities read off the clean run are :mod:`rs_interp.exact._checks`.

:func:`measure` measures only what it is asked for, each measurement once: :data:`MEASUREMENTS` says which
identities each one yields (a run of its own yields all of them at once; the clean run's checks are computed by
hand one by one, only those asked for), and the clean run is shared by every measurement that reads it in one
call (ended at the final stream where nothing asked for reads the logits). Nothing is computed in float64 that
the model does not compute in float64 (the gaps themselves are taken in float64)."""

from __future__ import annotations

import contextlib
from typing import Callable

import torch

from .. import _backend
from .. import _names as N
from .._backend import Model, Stop
from .._messages import clip
from . import _checks as C
from ._checks import MODEL_ERRORS, Identity, Missing, get, judge, rel
from ._layer_runs import _head_inputs, _rows, _start, _stop, _stop_here  # called by name here: tests count the runs
from .postnorm import frozen_heads
from .readout import compute_dtype
from .stream import Reader, reader_gradients, readers, watched, zero_leaf

__all__: list[str] = []


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
    return worst.gap, (f"a backward hook changes the gradients ({worst.where}): the gradient helpers would "
                       "differentiate something other than the model's function")


def _moving(g: torch.Generator, box: dict[str, torch.Tensor], name: str, watch: Callable | None = None) -> Callable:
    """A hook moving a head's z by a seeded random amount (about half its mean size), recording the moved z
    under ``name`` (the name asked: 4.x hands a hook its canonical name); ``watch`` is called with its gradient."""
    def fn(z: torch.Tensor, *, hook) -> torch.Tensor:
        d = torch.randn(z.shape, generator=g, dtype=torch.float64).to(z.dtype)
        d = d * (0.5 * float(z.detach().abs().mean()) + 1e-3)
        out = z + d
        box[name] = out.detach()
        return out if watch is None else watched(out, watch)
    return fn


def _keep(box: dict[str, torch.Tensor], name: str) -> Callable:
    def fn(t: torch.Tensor, *, hook) -> None:
        box[name] = t.detach()
    return fn


def _absent(model: Model, hooks: list[tuple[str, Callable]]) -> None:
    points = model.hook_dict  # (a bridge builds it at each read)
    absent = sorted({n for n, _ in hooks if n not in points})
    if absent:
        raise Missing(absent[0])


def _moved_run(model: Model, tokens: torch.Tensor, logits: bool) -> dict[str, torch.Tensor]:
    """The probe run with every head's z moved (seed 1, layer by layer), no gradients: the moved z and
    ``attn_out`` of every layer, and (with ``logits``) the logits; else ended after the last ``attn_out``."""
    L, box = model.cfg.n_layers, {}
    g = torch.Generator().manual_seed(1)
    fwd = [(N.z(l), _moving(g, box, N.z(l))) for l in range(L)]
    fwd += [(N.attn_out(l), _keep(box, N.attn_out(l))) for l in range(L)]
    _absent(model, fwd)
    if not logits:
        fwd.append((N.attn_out(L - 1), _stop_here))
    with torch.no_grad(), model.hooks(fwd_hooks=fwd):
        try:
            box["logits"] = model(tokens, return_type="logits")
        except Stop:
            pass
    return box


def _heads(model: Model, moved: dict[str, torch.Tensor]) -> tuple[float, str]:
    worst, where, dt = 0.0, "", compute_dtype(model)
    for l in range(model.cfg.n_layers):
        per_head, bias = frozen_heads(model, l, get(moved, N.z(l)), dt)  # z W_O (post-norm: scale frozen)
        gap = rel(get(moved, N.attn_out(l)), per_head.sum(0) + bias)
        if gap > worst:
            worst, where = gap, f"layer {l}"
    post = " through the post-attention norm, its scale frozen," if _backend.has_post_norms(model) else ""
    return worst, (f"the heads' z W_O + b_O{post} are not attn_out ({where}): a head's write is not what its z says "
                   "(a norm after the attention that rs_interp does not read?)")


def _gradient_run(model: Model, tokens: torch.Tensor, wanted: list[Reader]) -> dict:
    """The run with every head's z moved as in :func:`_moved_run` and one backward pass of a random linear
    function of the logits (seed 2) to a zero leaf at the embedding: the gradient at every head's z and every
    ``resid_pre`` (``"grads"``, in the compute dtype), the summed gradients of ``wanted``'s readers per layer
    (``"by_reader"``: the layer's readers, or ``logits``), which reader kinds fired, and the logits."""
    cfg, L, dt = model.cfg, model.cfg.n_layers, compute_dtype(model)
    grads: dict[str, torch.Tensor] = {}
    by_reader: dict[tuple[int, str], torch.Tensor] = {}
    fired: set = set()

    def save(name: str) -> Callable:
        def fn(grad: torch.Tensor) -> None:
            grads[name] = grad.detach().to(dt)
        return fn

    def watch(name: str) -> Callable:
        def fn(t: torch.Tensor, *, hook) -> torch.Tensor:
            return watched(t, save(name))
        return fn

    def on_grad(reader: Reader, fill: Callable[[torch.Tensor], None]) -> None:
        buf = torch.empty(len(reader.labels), tokens.numel() * cfg.d_model, dtype=dt)
        fill(buf)
        fired.update((reader.kind, (reader.layer, reader.kind)))
        key = (reader.layer, "logits" if reader.kind == "logits" else "layer")
        by_reader[key] = by_reader.get(key, 0) + buf.sum(0)

    g, box = torch.Generator().manual_seed(1), {}
    with torch.enable_grad():
        leaf, at_embed = zero_leaf(model)
        hooks = [at_embed] + [(N.z(l), _moving(g, box, N.z(l), save(N.z(l)))) for l in range(L)]
        hooks += [(N.resid_pre(l), watch(f"pre{l}")) for l in range(L)]
        _absent(model, hooks)
        with reader_gradients(model, wanted, on_grad, dt, extra=hooks) as runnable, model.hooks(fwd_hooks=runnable):
            logits = model(tokens, return_type="logits")
            R = torch.randn(logits.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
            R = R.to(logits.device, logits.dtype)
            (logits * R).sum().div(R.numel()).backward(inputs=[leaf])
    return {"grads": grads, "by_reader": by_reader, "fired": fired, "logits": logits.detach()}


def _failed(err: Exception) -> str:
    if isinstance(err, Missing):
        return f"the model has no hook point {err.args[0]}"
    return f"{type(err).__name__}: {clip(err, 200)}"


def _gradient_identities(model: Model, tokens: torch.Tensor, tol: float,
                         moved: Callable[[], dict], with_readers: bool = True) -> dict[str, Identity]:
    """``z``, ``input`` and ``readers`` from one backward pass (:func:`_gradient_run`) through every reader's
    input (per head: what patching adds a value to); where those inputs cannot be read, ``z`` and ``input``
    from the run without them. ``readers`` also compares the run's logits with ``moved()``'s, the model's
    own run with the same z moved (:func:`_moved_run`). Without ``with_readers``, ``z`` and ``input`` only,
    from the model's own run (no per-head copies of the stream, no run with z moved to compare with)."""
    if not with_readers:
        try:
            run = _gradient_run(model, tokens, [])
        except (Missing, *MODEL_ERRORS) as err:
            return {name: Identity(name, False, float("nan"), tol, f"the run with gradients failed: {_failed(err)}")
                    for name in ("z", "input")}
        return _on_path(run["grads"], model.cfg.n_layers, tol)
    L = model.cfg.n_layers
    wanted = readers(model, projected=False)
    points = model.hook_dict  # (a bridge builds it at each read)
    missing = sorted({r.hook for r in wanted if r.kind in ("mlp", "logits") and r.hook not in points})
    readers_failed = None
    try:
        if missing:
            raise Missing(missing[0])
        run = _gradient_run(model, tokens, wanted)
    except (Missing, *MODEL_ERRORS) as err:  # the readers' hooks: measure the rest without them
        readers_failed = _failed(err)
        try:
            run = _gradient_run(model, tokens, [])
        except (Missing, *MODEL_ERRORS) as err2:
            return {name: Identity(name, False, float("nan"), tol, f"the run with gradients failed: {_failed(err2)}")
                    for name in ("z", "input", "readers")}
    if readers_failed is None:
        complete = judge("readers", tol, lambda: _receivers_complete(model, run, moved, tol))
    else:
        complete = Identity("readers", False, float("nan"), tol, f"the receivers cannot be read: {readers_failed}")
    return {**_on_path(run["grads"], L, tol), "readers": complete}


def _receivers_complete(model: Model, run: dict, moved: Callable[[], dict], tol: float) -> tuple[float, str]:
    """``readers`` from :func:`_gradient_run`'s ``run`` through every receiver's input: the run's logits are the
    model's own (``moved()``'s, the same z moved), every kind of receiver is on the forward path, and each layer's
    stream gradient is its receivers' summed gradients plus the next layer's (or the logits')."""
    cfg, L = model.cfg, model.cfg.n_layers
    grads, by_reader, fired = run["grads"], run["by_reader"], run["fired"]
    # e.g. a hook on a q/k/v projection module the split inputs bypass
    split = rel(run["logits"], get(moved(), "logits"))
    if split > tol:
        return split, ("the run through the per-head inputs (hook_q_input ... hook_v_input) gives other logits than "
                       "the model's own run: something the model computes on the way to q, k, v (a hook or a replaced "
                       "forward on a projection module) is not computed there, so edges into heads would be another "
                       "model's")
    for kind, hook in (("mlp", "hook_mlp_in"), ("q", "hook_q_input ... hook_v_input")):
        if (kind == "q" or not cfg.attn_only) and kind not in fired:
            return float("inf"), (f"this model's {hook} is not on the forward path (no gradient reaches it): edges "
                                  f"into {'MLPs' if kind == 'mlp' else 'heads'} cannot be patched or estimated")
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
    return worst, (f"the receivers' gradients miss the stream's at {where}: some reader of the stream is not one of "
                   "the graph's receivers (a norm after a sublayer, an input the hooks do not see)")


def _on_path(grads: dict[str, torch.Tensor], L: int, tol: float) -> dict[str, Identity]:
    """``z`` and ``input`` from a backward pass's gradients: each on the path iff its gradient is computed at all
    (0 is a gradient: a head nothing downstream reads)."""
    def z_on_path() -> tuple[float, str]:
        for l in range(L):
            if N.z(l) not in grads:
                return float("inf"), f"{N.z(l)} is not on the forward path: no gradient reaches it"
        return 0.0, ""

    def input_on_path() -> tuple[float, str]:
        return ((0.0 if "pre0" in grads else float("inf")),
                f"{N.RESID0} is not on the forward path: no gradient reaches it")

    return {"z": judge("z", tol, z_on_path), "input": judge("input", tol, input_on_path)}


#: Each measurement and the identities it yields, all at once (``source`` is the loader's:
#: :func:`rs_interp.exact.certificate.note_source`), but the clean run's checks and ``readers`` (the gradient run
#: through every receiver's per-head input, and the run with z moved beside it), only where asked for. Every
#: identity is yielded by exactly one.
MEASUREMENTS: dict[str, tuple[str, ...]] = {
    "clean run": ("embedding", "stream", "values", "scores", "scores read", "projections", "mlp reads", "mlp writes",
                  "mlp weights"),
    "logits": ("readout", "vocabulary"),
    "z moved": ("heads",),
    "gradient": ("z", "input", "readers"),
    "rows": ("rows",),
    "head inputs": ("head inputs",),
    "backward hooks": ("gradients",),
    "from a layer": ("start at layer",),
    "to a layer": ("stop at layer",),
}
#: The measurements that read the clean run's logits (the others end it at the final stream).
_READ_LOGITS = {"logits", "from a layer", "rows"}
#: How many of its own runs each measurement takes through the unembedding (the clean run's: :data:`_READ_LOGITS`).
_UNEMBEDDINGS = {"gradient": 2, "rows": 2, "from a layer": 1, "backward hooks": 2}


class _Probe:
    """One measuring call's probe batch and its runs, each made once and only as far as it is read: the clean
    run (:func:`rs_interp.exact._checks.clean_run`) and the run with z moved (:func:`_moved_run`)."""

    def __init__(self, model: Model, measurements: set[str], reads_logits: bool) -> None:
        self.model, self.tokens = model, C.probe(model)
        self.box = C.clean_run(model, self.tokens, logits=bool(measurements & _READ_LOGITS))
        self._moved: dict | None = None
        self._moved_logits = reads_logits

    def moved(self) -> dict[str, torch.Tensor]:
        """The run with z moved (a failure of it raised again at each read, each identity failing by it)."""
        if self._moved is None:
            try:
                self._moved = _moved_run(self.model, self.tokens, self._moved_logits)
            except (Missing, *MODEL_ERRORS) as err:
                self._moved = {"error": err}
        if "error" in self._moved:
            raise self._moved["error"]
        return self._moved


def _yielded(model: Model, probe: _Probe, measurement: str, tol: float, names: set[str]) -> dict[str, Identity]:
    """What ``measurement`` yields (:data:`MEASUREMENTS`), measured on ``probe``: of the clean run's checks,
    those in ``names`` (the run is the cost, shared; each check reads it by hand); of the others, all."""
    box, tokens, mlps = probe.box, probe.tokens, not model.cfg.attn_only
    if measurement == "clean run":
        projected = _backend.projection_layers(model)
        checks = {"embedding": (C.embedding, True), "stream": (C.stream, True), "values": (C.values, True),
                  "scores": (C.scores, True), "scores read": (C.scores_read, True), "mlp reads": (C.mlp_reads, mlps),
                  "mlp writes": (C.mlp_writes, mlps), "mlp weights": (C.mlp_weights, mlps),
                  "projections": (lambda m, b: C.projections(m, b, projected), bool(projected))}
        return {name: judge(name, tol, lambda fn=fn: fn(model, box), applies=applies)
                for name, (fn, applies) in checks.items() if name in names}
    if measurement == "logits":
        return {"readout": judge("readout", tol, lambda: C.readout_check(model, box)),
                "vocabulary": judge("vocabulary", tol, lambda: C.vocabulary(model, box))}
    if measurement == "z moved":
        return {"heads": judge("heads", tol, lambda: _heads(model, probe.moved()))}
    if measurement == "gradient":  # the receivers' per-head copies only where readers is asked for
        return _gradient_identities(model, tokens, tol, probe.moved, with_readers="readers" in names)
    single = {"rows": ("rows", lambda: _rows(model, tokens, box)),
              "head inputs": ("head inputs", lambda: _head_inputs(model, tokens, box)),
              "backward hooks": ("gradients", lambda: _gradients(model, tokens)),
              "from a layer": ("start at layer", lambda: _start(model, box)),
              "to a layer": ("stop at layer", lambda: _stop(model, tokens, box))}
    name, fn = single[measurement]
    return {name: judge(name, tol, fn)}


def measure(model: Model, tol: float, names: tuple[str, ...] | None = None) -> dict[str, Identity]:
    """The identities ``names`` (default: every one of :data:`MEASUREMENTS`) on ``model``, flags already set by
    the caller: each measurement that yields one of them, once, and what else it yields at no cost (every
    identity of a run of its own; of the clean run, only those asked for: each is a computation by hand).

    Raises:
        ValueError: the model's forward pass fails on the probe batch (named).
    """
    names = set(n for ys in MEASUREMENTS.values() for n in ys) if names is None else set(names)
    measurements = {m for m, ys in MEASUREMENTS.items() if names & set(ys)}
    runs = [m for m in measurements if m != "backward hooks" or _backward_hooks(model)]  # (none: nothing is run)
    unembeddings = bool(measurements & _READ_LOGITS) + sum(_UNEMBEDDINGS.get(m, 0) for m in runs)
    # 3.x copies W_U at each unembedding: stored transposed (one copy) where more than two runs reach it
    with _backend.unembed_stored_transposed(model) if unembeddings > 2 else contextlib.nullcontext():
        probe = _Probe(model, measurements, reads_logits="readers" in names)
        if model.cfg.n_layers == 0:  # nothing to read: every identity is vacuous
            return {k: Identity(k, None, float("nan"), tol) for m in measurements for k in MEASUREMENTS[m]}
        out: dict[str, Identity] = {}
        for measurement in (m for m in MEASUREMENTS if m in measurements):  # in the table's order
            out.update(_yielded(model, probe, measurement, tol, names))
    return out
