"""The Jacobian lens (J-lens; Gurnee et al. 2026, "Verbalizable Representations Form a Global Workspace
in Language Models"): the stream after block ``l`` carried to the final stream by the average Jacobian
of the model, then read by the model's own final norm and unembedding.

For each source layer ``l`` (every block but the last) the lens holds one ``d_model x d_model`` matrix

    ``J_l = mean over prompts of  (1 / |V|) sum_{t in V} sum_{t' in V, t' >= t} d h_final[t'] / d h_l[t]``,

``h_l`` the stream after block ``l`` (``blocks.l.hook_resid_post``), ``h_final`` the stream after the last
block, before the final norm, ``V`` the valid positions of a prompt: the first ``skip_first`` (16) and the
last are left out (attention sinks; no next token), so a prompt counts only if it has more than
``skip_first + 1`` tokens; prompts are weighted equally, at most ``max_seq_len`` (128) tokens each. This is
the estimator and are the defaults of Anthropic's reference implementation (``anthropics/jacobian-lens``,
Apache-2.0: ``jlens/fitting.py``'s ``jacobian_for_prompt`` and ``fit``) and of TransformerLens 4.3's
``tools.analysis.JacobianLens.fit``. The sum over ``t' >= t`` is what one backward pass per output dimension
``i`` gives when its cotangent is ``e_i`` at every valid target position at once: causal attention carries
nothing from a position to an earlier one.

The lens reads a stream ``h`` at layer ``l`` as ``softcap(N_final(J_l h) W_U + b_U)``
(:func:`jacobian_lens`), the logit lens (:func:`rs_interp.logit_lens`) with ``J_l = I``; the last block is
read with the identity, as the model itself reads it.

The fit (:func:`fit_jacobian_lens`) runs one forward pass per prompt, keeps its graph, and takes the
``d_model`` backward passes from it in batches of cotangents (``torch.autograd.grad(...,
is_grads_batched=True)``: the forward is never replicated), every source layer from the same passes.
Files (:meth:`JacobianLens.save`, :meth:`JacobianLens.load`) are the reference's: ``J``, ``n_prompts``,
``source_layers``, ``d_model`` (float16 by default) with the provenance under ``metadata``, and its fit
checkpoint (``jacobian_sum``, ``n_done``, ...), so TransformerLens 4.3's ``JacobianLens.load`` reads what
rs_interp writes and the reverse.

**Bases.** A lens holds matrices in the basis of the stream it was fitted on. TransformerLens's
``center_writing_weights`` (``load_pretrained``'s default with ``fold_ln``) makes every write into the
stream mean-free: the processed stream is ``P h`` with ``P = I - 1 1^T / d_model``. When every reader of
the stream subtracts its mean (LayerNorm), the processed model's lens is exactly
``J' = P J + (I - P)`` of the unprocessed model's ``J`` (per prompt: the writes are ``P`` times the
unprocessed ones and read the stream through ``P``), so a lens fitted on raw weights (the published ones,
TransformerLens 4.3's) is mapped onto a centred model; a centred model whose readers do not all centre,
or a lens fitted on a centred stream read on an uncentred one (its mean row is lost), is refused by name.
Folding the norms' gains (``fold_ln``) and the value biases does not change the stream.

>>> import rs_interp as ri
>>> model = ri.load_toy_model("induction-2l")
>>> lens = fit_jacobian_lens(model, ri.induction_batch(2, seed=0).tokens, skip_first=4, progress=False)
>>> lens.source_layers, tuple(lens.jacobians.shape)
((0,), (1, 64, 64))
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from jaxtyping import Float, Int

from .. import _backend
from .. import _names as N
from .._backend import Model, Stop
from .._budget import MEMORY_BUDGET
from .._progress import bar
from .._state import preserve_state
from ..exact.certificate import require
from ..exact.readout import compute_dtype, final_norm_of
from ..exact.stream import record
from ..exact.validate import check_int_range, check_tokens
from ..labels import lens_label
from .lens import read_points

__all__ = ["JacobianLens", "JacobianLensReadings", "fit_jacobian_lens", "jacobian_lens", "stream_basis", "SKIP_FIRST",
           "MAX_SEQ_LEN"]

#: Leading positions left out of the estimator (the reference's ``SKIP_FIRST_N_POSITIONS``).
SKIP_FIRST = 16
#: Tokens per prompt at most (the reference's and TransformerLens 4.3's ``max_seq_len``).
MAX_SEQ_LEN = 128
#: The estimator's name in the files' provenance (TransformerLens 4.3's ``ESTIMATOR_JACOBIAN``).
ESTIMATOR = "jacobian_lens"
RAW, CENTRED = "raw", "centred"
#: TransformerLens 4.3's name of the raw basis (its ``processing.weight_basis``).
RAW_HF = "raw_huggingface"


# --- the lens: matrices, files, merging -----------------------------------------------------------------

@dataclass(frozen=True)
class JacobianLens:
    """A fitted Jacobian lens: one ``d_model x d_model`` matrix per source layer (module docstring).

    Attributes:
        jacobians: (layer, d_model, d_model) the matrices ``J_l``, in the order of ``source_layers``; row
            ``i`` is the final stream's dimension ``i``.
        source_layers: the blocks whose output each matrix reads (every block but the last, for a full fit).
        n_prompts: the prompts averaged.
        metadata: provenance (model name, the estimator's settings, the stream's basis ``"stream_basis"``:
            ``"raw"`` or ``"centred"``); written with the file, compared by :meth:`merge`.

    >>> lens = JacobianLens(torch.eye(4).expand(2, 4, 4), (0, 1), n_prompts=1)
    >>> lens.d_model, lens.matrix(1).shape, lens.basis
    (4, torch.Size([4, 4]), 'raw')
    """

    jacobians: Float[torch.Tensor, "layer d_model d_model"]
    source_layers: tuple[int, ...]
    n_prompts: int
    metadata: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        J = self.jacobians
        layers = self.source_layers
        if J.ndim != 3 or J.shape[1] != J.shape[2] or J.shape[0] != len(layers) or not layers:
            raise ValueError(f"jacobians must be (layer, d_model, d_model), one per source layer; got "
                             f"{tuple(J.shape)} for source_layers {layers}")
        if list(layers) != sorted(set(layers)) or min(layers) < 0:
            raise ValueError(f"source_layers must be distinct non-negative layers in increasing order, got {layers}")
        if not torch.isfinite(J).all():
            raise ValueError("the lens's matrices hold non-finite entries")

    @property
    def d_model(self) -> int:
        return int(self.jacobians.shape[-1])

    @property
    def basis(self) -> str:
        """The basis of the stream it was fitted on: ``"raw"`` (weights as the checkpoint has them, the
        published lenses') or ``"centred"`` (every write mean-free: ``center_writing_weights``)."""
        return _file_basis(self.metadata)

    def matrix(self, layer: int) -> Float[torch.Tensor, "d_model d_model"]:
        """``J_layer`` (raises naming the fitted layers for another)."""
        if layer not in self.source_layers:
            raise ValueError(f"layer {layer} is not one of this lens's source layers {list(self.source_layers)}")
        return self.jacobians[self.source_layers.index(layer)]

    def transport(self, x: Float[torch.Tensor, "... d_model"], layer: int) -> Float[torch.Tensor, "... d_model"]:
        """``J_layer h`` for every stream vector ``h`` of ``x`` (in ``x``'s dtype), in the lens's own basis."""
        return x @ self.matrix(layer).to(x.dtype).T

    def __repr__(self) -> str:
        return (f"JacobianLens(source_layers={list(self.source_layers)}, d_model={self.d_model}, "
                f"n_prompts={self.n_prompts}, basis={self.basis!r})")

    def save(self, path: str | os.PathLike, *, dtype: torch.dtype = torch.float16) -> Path:
        """Write the reference's file: ``J`` ({layer: matrix} in ``dtype``, float16 by default as the
        reference's: the entries are of order one), ``n_prompts``, ``source_layers``, ``d_model``, and the
        provenance under ``metadata`` (additive: the reference's loader ignores it)."""
        _check_metadata(self.metadata)
        payload = {"J": {int(l): m.to(dtype) for l, m in zip(self.source_layers, self.jacobians)},
                   "n_prompts": int(self.n_prompts), "source_layers": list(self.source_layers), "d_model": self.d_model}
        if self.metadata:
            payload["metadata"] = self.metadata
        return _atomic_save(payload, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "JacobianLens":
        """Read a lens file (``J``: the reference's, TransformerLens 4.3's or rs_interp's) or a fit checkpoint
        (``jacobian_sum`` and ``n_done``: the running sum, divided here by the prompts done).

        Raises:
            ValueError: neither kind of file, or a checkpoint with no prompt done.
        """
        payload = torch.load(path, map_location="cpu", weights_only=True)
        meta = dict(payload.get("metadata") or {})
        if "J" in payload:
            layers = tuple(sorted(int(l) for l in payload["J"]))
            J = torch.stack([_widened(payload["J"][l]) for l in sorted(payload["J"], key=int)])
            return cls(J, layers, n_prompts=int(payload.get("n_prompts", 0)), metadata=meta)
        if "jacobian_sum" in payload:
            done = int(payload.get("n_done", 0))
            if done <= 0 or not payload["jacobian_sum"]:
                raise ValueError(f"{path} is a fit checkpoint with no prompt done (n_done={done}): nothing to average")
            sums = payload["jacobian_sum"]
            layers = tuple(sorted(int(l) for l in sums))
            J = torch.stack([(sums[l].double() / done).to(_widened(sums[l]).dtype) for l in sorted(sums, key=int)])
            for key in ("target_layer", "skip_first", "model_name", "corpus"):
                if key in payload and key not in meta:
                    meta[key] = payload[key]
            return cls(J, layers, n_prompts=done, metadata=meta)
        raise ValueError(f"{path} is neither a Jacobian lens file (a 'J' key) nor a fit checkpoint ('jacobian_sum'): "
                         f"its keys are {sorted(payload)}")

    @classmethod
    def merge(cls, lenses: Sequence["JacobianLens"]) -> "JacobianLens":
        """One lens from lenses fitted on disjoint prompt slices: their matrices' mean weighted by
        ``n_prompts`` (the reference's ``merge``), which equals one fit on all the prompts.

        Raises:
            ValueError: no lens, a lens of no prompt, or lenses of other source layers, width or provenance
                (the metadata but ``n_prompts``: another model, corpus or estimator setting).
        """
        lenses = list(lenses)
        if not lenses:
            raise ValueError("merge needs at least one lens")
        first = lenses[0]
        for lens in lenses:
            if lens.n_prompts <= 0:
                raise ValueError(f"every lens merged must have averaged prompts; one has n_prompts={lens.n_prompts}")
            if lens.source_layers != first.source_layers or lens.d_model != first.d_model:
                raise ValueError("the lenses merged must share source_layers and d_model")
            if _provenance(lens.metadata) != _provenance(first.metadata):
                raise ValueError("the lenses merged must share their provenance (metadata but n_prompts): "
                                 f"{_provenance(first.metadata)} against {_provenance(lens.metadata)}")
        total = sum(lens.n_prompts for lens in lenses)
        J = sum(lens.jacobians.double() * lens.n_prompts for lens in lenses) / total
        meta = dict(first.metadata) | ({"n_prompts": total} if first.metadata else {})
        return cls(J.to(first.jacobians.dtype), first.source_layers, n_prompts=total, metadata=meta)


def _widened(matrix: torch.Tensor) -> torch.Tensor:
    """A stored matrix in float64 if it was stored so, else float32 (a float16 file's)."""
    return matrix.to(torch.float64 if matrix.dtype == torch.float64 else torch.float32)


def _provenance(meta: dict) -> dict:
    return {k: v for k, v in meta.items() if k != "n_prompts"}


def _file_basis(meta: dict) -> str:
    """The basis a file's provenance records: rs_interp's ``stream_basis``; TransformerLens 4.3's
    ``processing.weight_basis`` (``"raw_huggingface"``); none (the reference's files, fitted on raw weights)."""
    basis = meta.get("stream_basis")
    if basis is None:
        processing = meta.get("processing")
        weights = processing.get("weight_basis", RAW_HF) if isinstance(processing, dict) else RAW_HF
        basis = RAW if weights == RAW_HF else str(weights)
    if basis not in (RAW, CENTRED):
        raise ValueError(f"this lens records the stream basis {basis!r}; rs_interp reads {RAW!r} and {CENTRED!r}")
    return basis


def _check_metadata(meta: Any, where: str = "metadata") -> None:
    """What ``torch.load(weights_only=True)`` reads back: None, bool, int, float, str, and lists, tuples
    and string-keyed dicts of them."""
    if meta is None or type(meta) in (bool, int, float, str):
        return
    if type(meta) in (list, tuple):
        for i, item in enumerate(meta):
            _check_metadata(item, f"{where}[{i}]")
        return
    if type(meta) is dict:
        for key, item in meta.items():
            if type(key) is not str:
                raise ValueError(f"{where} has a key {key!r} that is not a string")
            _check_metadata(item, f"{where}.{key}")
        return
    raise ValueError(f"{where} holds a {type(meta).__name__}: a lens file keeps None, bool, int, float, str, lists "
                     "and dicts")


def _atomic_save(payload: dict, path: str | os.PathLike) -> Path:
    """``torch.save`` to a file beside ``path``, then renamed onto it: a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    torch.save(payload, tmp)
    os.replace(tmp, path)
    return path


# --- the stream's basis ------------------------------------------------------------------------------------

def _centres(model: Model) -> bool:
    """Whether every reader of the stream subtracts its mean: each block's norms before its sublayers
    and the final norm are LayerNorms."""
    norms = [_backend.pre_norm(model, l, n) for l in range(model.cfg.n_layers)
             for n in (("ln1",) if model.cfg.attn_only else ("ln1", "ln2"))]
    return all(n.centres for n in norms + [final_norm_of(model)])


def stream_basis(model: Model) -> str:
    """The basis of ``model``'s residual stream: ``"centred"`` where the stream after the embedding and after
    every block has mean zero over ``d_model`` on a probe (TransformerLens's ``center_writing_weights``), else
    ``"raw"``. Measured: every row's ``|mean| / rms`` below ``1e-5`` (30 epsilons in half precision), as weights
    centred in float32 leave it, and below a tenth of what an uncentred stream's rows show (``1 / sqrt(d_model)``,
    the mean of ``d_model`` terms of either sign).

    >>> import rs_interp as ri
    >>> stream_basis(ri.load_toy_model("induction-2l"))
    'raw'
    """
    n = min(8, model.cfg.n_ctx)
    tokens = torch.randint(0, model.cfg.d_vocab, (1, n), generator=torch.Generator().manual_seed(0))
    tokens = tokens.to(model.cfg.device)
    names = {N.RESID0} | {N.resid_post(l) for l in range(model.cfg.n_layers)}
    with preserve_state(model):
        box = record(model, tokens, lambda name: name in names)
    tol = min(0.1 / math.sqrt(model.cfg.d_model), max(1e-5, 30 * torch.finfo(model.cfg.dtype).eps))
    for x in box.values():
        x = x.to(torch.float64)
        ratio = x.mean(-1).abs() / x.pow(2).mean(-1).sqrt().clamp_min(1e-300)
        if float(ratio.max()) > tol:
            return RAW
    return CENTRED


def in_model_basis(lens: JacobianLens, model: Model, helper: str) -> Float[torch.Tensor, "layer d_model d_model"]:
    """The lens's matrices in ``model``'s basis, in the model's compute dtype: as they are where the bases
    agree; ``P J + (I - P)`` for a raw lens on a centred model whose readers all centre (module docstring).

    Raises:
        ValueError: another width or layers outside the model, another model's name, or bases no exact map
            joins (named).
    """
    cfg = model.cfg
    if lens.d_model != cfg.d_model:
        raise ValueError(f"{helper}: the lens was fitted for d_model={lens.d_model}; the model has {cfg.d_model}: "
                         "another model")
    if max(lens.source_layers) >= cfg.n_layers - 1:
        raise ValueError(f"{helper}: the lens has source layers {list(lens.source_layers)}; this "
                         f"{cfg.n_layers}-layer model's are 0..{cfg.n_layers - 2} (the last block is read as it is): "
                         "another model")
    target = lens.metadata.get("target_layer", cfg.n_layers - 1)
    if target != cfg.n_layers - 1:
        raise ValueError(f"{helper}: the lens carries the stream to layer {target}, not to the final stream after "
                         f"layer {cfg.n_layers - 1}: refit it for the final layer")
    named = lens.metadata.get("model_name")
    if named is not None and getattr(cfg, "model_name", None) not in (None, named):
        raise ValueError(f"{helper}: the lens was fitted on {named!r}, the model is {cfg.model_name!r}")
    dt = compute_dtype(model)
    J = lens.jacobians.to(dt)
    mine = stream_basis(model)
    if lens.basis == mine:
        return J
    if lens.basis == CENTRED:
        raise ValueError(f"{helper} refuses this lens on this model: it was fitted on a centred stream "
                         "(center_writing_weights) and the model's stream is not centred; the lens's mean row, which "
                         "the uncentred stream reads, was never measured. What to do: fit the lens on this model "
                         "(rs_interp.fit_jacobian_lens), or load the model with center_writing_weights=True")
    if not _centres(model):
        raise ValueError(f"{helper} refuses this lens on this model: the lens was fitted on raw weights and this "
                         "model's stream is centred, but not every reader of the stream subtracts its mean (a norm "
                         "other than LayerNorm), so no map of the raw lens is this model's lens. What to do: fit the "
                         "lens on this model")
    d = cfg.d_model
    P = torch.eye(d, dtype=dt) - torch.full((d, d), 1.0 / d, dtype=dt)
    return P @ J + (torch.eye(d, dtype=dt) - P)


# --- the fit -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Fit:
    """The fit's settings, validated once."""

    source_layers: tuple[int, ...]
    skip_first: int
    max_seq_len: int
    batch_size: int
    d_model: int
    target_layer: int

    @classmethod
    def of(cls, model: Model, source_layers, skip_first, max_seq_len, batch_size, memory_budget) -> "_Fit":
        L = model.cfg.n_layers
        if L < 2:
            raise ValueError("the Jacobian lens reads the blocks before the last: the model has one block")
        layers = tuple(range(L - 1)) if source_layers is None else tuple(
            sorted({check_int_range("source_layers entry", l, -L, L - 2) % L for l in source_layers}))
        if not layers:
            raise ValueError("source_layers is empty")
        skip_first = check_int_range("skip_first", skip_first, 0)
        max_seq_len = check_int_range("max_seq_len", max_seq_len, skip_first + 2)
        check_int_range("memory_budget", memory_budget, 1)
        if batch_size is None:
            batch_size = _batch_size(model, min(max_seq_len, model.cfg.n_ctx), memory_budget)
        batch_size = check_int_range("batch_size", batch_size, 1)
        return cls(layers, skip_first, max_seq_len, min(batch_size, model.cfg.d_model), model.cfg.d_model, L - 1)


#: Cotangents per backward pass at most by default: more amortise the graph's walk no further on a CPU and
#: only fill the caches (measured on GPT-2's shape, 128 tokens: 16 beat 8, 48 and 128).
_COTANGENTS = 16


def _batch_size(model: Model, pos: int, budget: int) -> int:
    """Cotangents per backward within ``budget`` bytes: per cotangent, a block's backward transients (a
    few streams, the MLP's hidden layer twice, the attention's scores and pattern), at most
    :data:`_COTANGENTS`."""
    cfg = model.cfg
    elem = torch.finfo(compute_dtype(model)).bits // 8
    d_mlp = 0 if cfg.attn_only else (cfg.d_mlp or 4 * cfg.d_model)
    per = elem * pos * (4 * cfg.d_model + 2 * d_mlp + 2 * cfg.n_heads * pos)
    return max(1, min(_COTANGENTS, budget // per))


def _prompt_tokens(model: Model, prompts: Any, max_seq_len: int) -> list[torch.Tensor]:
    """Each prompt as (1, pos) token ids, at most ``max_seq_len``: rows of a (batch, pos) tensor, 1-D
    tensors, or strings (``model.to_tokens``, as the reference and TransformerLens 4.3 tokenize)."""
    if isinstance(prompts, (str, torch.Tensor)):
        prompts = [prompts] if isinstance(prompts, str) or prompts.ndim == 1 else list(prompts)
    out = []
    for p in prompts:
        t = model.to_tokens(p) if isinstance(p, str) else p
        out.append(check_tokens(model, t[..., :max_seq_len] if t.ndim == 1 else t[:, :max_seq_len]))
        if out[-1].shape[0] != 1:
            raise ValueError(f"each prompt must be one sequence; got shape {tuple(out[-1].shape)}")
    if not out:
        raise ValueError("prompts is empty")
    return out


class _Frozen:
    """The parameters' ``requires_grad`` off for the duration (so the graph starts at the first source
    layer and holds no weight's gradient path), restored after."""

    def __init__(self, model: Model) -> None:
        self.saved = [(p, p.requires_grad) for p in model.parameters()]

    def __enter__(self) -> None:
        for p, _ in self.saved:
            p.requires_grad_(False)

    def __exit__(self, *exc: object) -> None:
        for p, flag in self.saved:
            p.requires_grad_(flag)


def _forward(model: Model, tokens: torch.Tensor, fit: _Fit) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One forward pass keeping its graph: the final stream and each source layer's stream (the first a
    leaf that requires grad, so the graph starts there), the pass ended at the final stream."""
    names = [N.resid_post(l) for l in fit.source_layers]
    final = N.final_stream(model.cfg.n_layers)
    box: dict[str, torch.Tensor] = {}

    def capture(name: str) -> Callable:
        def fn(x: torch.Tensor, *, hook: Any) -> torch.Tensor:
            if name == names[0]:
                x = x.detach().requires_grad_(True)
            box[name] = x
            if name == final:
                raise Stop  # the unembedding is not read
            return x

        return fn

    try:
        with torch.enable_grad(), model.hooks(fwd_hooks=[(n, capture(n)) for n in [*names, final]]):
            model(tokens, return_type=None)
    except Stop:
        pass
    if final not in box or any(n not in box for n in names):
        raise ValueError(f"the Jacobian lens reads {', '.join(n for n in [*names, final] if n not in box)}, which the "
                         "forward pass never reached")
    return box[final], [box[n] for n in names]


def _prompt_jacobians(model: Model, tokens: torch.Tensor, fit: _Fit, dt: torch.dtype) -> torch.Tensor:
    """(layer, d_model, d_model): one prompt's term of the estimator, every source layer from the same
    ``d_model`` backward passes, ``fit.batch_size`` cotangents at a time."""
    P, d = tokens.shape[1], fit.d_model
    valid = torch.arange(fit.skip_first, P - 1, device=tokens.device)
    target, sources = _forward(model, tokens, fit)
    out = torch.empty(len(sources), d, d, dtype=dt)
    for s in range(0, d, fit.batch_size):
        n = min(fit.batch_size, d - s)
        rows = torch.arange(n, device=tokens.device)
        cot = target.new_zeros((n, *target.shape))
        cot[rows[:, None], 0, valid[None, :], s + rows[:, None]] = 1  # e_i at every valid target position
        grads = torch.autograd.grad(target, sources, cot, retain_graph=s + n < d, is_grads_batched=True,
                                    allow_unused=True)
        for i, g in enumerate(grads):
            if g is None:
                raise ValueError(f"the final stream does not depend on {N.resid_post(fit.source_layers[i])}: its hook "
                                 "point is off the forward path, so no lens can be fitted there")
            out[i, s: s + n] = g[:, 0, valid].to(dt).mean(1)
    return out


def _metadata(model: Model, fit: _Fit, corpus: str | None, extra: dict | None, n_prompts: int, basis: str) -> dict:
    own = {"model_name": getattr(model.cfg, "model_name", None), "estimator": ESTIMATOR, "corpus": corpus,
           "n_prompts": n_prompts, "fit_dtype": str(compute_dtype(model)).removeprefix("torch."),
           "target_layer": fit.target_layer, "max_seq_len": fit.max_seq_len, "skip_first_positions": fit.skip_first,
           "hook_convention": "blocks.{layer}.hook_resid_post", "stream_basis": basis, "rs_interp_fit": True,
           "transformer_lens_version": _backend.TL_VERSION}
    clash = sorted(set(own) & set(extra or {}))
    if clash:
        raise ValueError(f"metadata cannot set the fit's own provenance keys {clash}")
    meta = dict(extra or {}) | own
    _check_metadata(meta)
    return meta


def _resume(path: Path, fit: _Fit, dt: torch.dtype) -> tuple[torch.Tensor, int, int]:
    """``(jacobian_sum, n_done, next_idx)`` from the reference's checkpoint at ``path``.

    Raises:
        ValueError: a checkpoint of other source layers, target layer, skipped positions or width.
    """
    state = torch.load(path, map_location="cpu", weights_only=True)
    for key, want in (("source_layers", list(fit.source_layers)), ("target_layer", fit.target_layer),
                      ("skip_first", fit.skip_first)):
        if key in state and state[key] != want:
            raise ValueError(f"the checkpoint {path} was fitted with {key}={state[key]!r}, not {want!r}; "
                             "pass resume=False to start again")
    sums = state["jacobian_sum"]
    if sorted(int(l) for l in sums) != list(fit.source_layers) or sums[next(iter(sums))].shape[-1] != fit.d_model:
        raise ValueError(f"the checkpoint {path} holds other layers or another width than this fit")
    S = torch.stack([sums[l].to(torch.float64) for l in sorted(sums, key=int)])
    return S, int(state["n_done"]), int(state["next_idx"])


def _write_checkpoint(path: Path, S: torch.Tensor, n_done: int, next_idx: int, fit: _Fit, dt: torch.dtype,
                      meta: dict) -> None:
    """The reference's fit checkpoint (its six keys, the running sum in the lens's dtype) and the provenance."""
    _atomic_save({"jacobian_sum": {l: S[i].to(dt) for i, l in enumerate(fit.source_layers)}, "n_done": n_done,
                  "next_idx": next_idx, "source_layers": list(fit.source_layers), "target_layer": fit.target_layer,
                  "skip_first": fit.skip_first, "metadata": meta}, path)


def fit_jacobian_lens(
    model: Model,
    prompts: Int[torch.Tensor, "batch pos"] | Sequence[str | torch.Tensor],
    *,
    source_layers: Sequence[int] | None = None,
    skip_first: int = SKIP_FIRST,
    max_seq_len: int = MAX_SEQ_LEN,
    batch_size: int | None = None,
    memory_budget: int = MEMORY_BUDGET,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int = 1,
    resume: bool = True,
    corpus: str | None = None,
    metadata: dict | None = None,
    progress: bool = True,
) -> JacobianLens:
    """Fit the Jacobian lens of ``model`` on ``prompts`` (the estimator of the module docstring).

    Args:
        model: any ``Model`` (every family the certificate passes; the parameters' ``requires_grad`` is
            switched off during the fit and restored).
        prompts: a (batch, pos) tensor (one prompt a row), or a sequence of prompts, each a 1-D tensor of
            token ids or a string (tokenized by ``model.to_tokens``, as the reference and TransformerLens 4.3
            do). A prompt of at most ``skip_first + 1`` tokens has no valid position: it is skipped with a
            warning and not counted.
        source_layers: blocks whose output to read (default every block but the last; negative counts from
            the end).
        skip_first: leading positions left out of the estimator (16, the reference's).
        max_seq_len: tokens per prompt at most (128, the reference's).
        batch_size: cotangents per backward pass (default: as many as ``memory_budget`` allows, at most 16).
        memory_budget: bytes of one backward pass's transients, when ``batch_size`` is not given.
        checkpoint: a path for the reference's fit checkpoint (``jacobian_sum``, ``n_done``, ``next_idx``, ...),
            written every ``checkpoint_every`` prompts and at the end; with ``resume``, a checkpoint already
            there is continued from its ``next_idx``.
        corpus: a name of the prompts, kept in the provenance.
        metadata: more provenance (values ``torch.load(weights_only=True)`` reads back).
        progress: a bar over the prompts, with the time left.

    Raises:
        ValueError: the certificate cannot vouch for the model (the identities ``readout``: the final stream is
            what the unembedding reads, and ``gradients``), attention that is not causal (``bidirectional
            attention``: the estimator's sum over ``t' >= t`` is causality's), a source layer off the forward
            path, or no prompt long enough.

    >>> import rs_interp as ri
    >>> model = ri.load_toy_model("induction-2l")
    >>> lens = fit_jacobian_lens(model, ri.induction_batch(2, seed=0).tokens, skip_first=4, progress=False)
    >>> lens.n_prompts, lens.metadata["skip_first_positions"]
    (2, 4)
    """
    require(model, "fit_jacobian_lens")
    fit = _Fit.of(model, source_layers, skip_first, max_seq_len, batch_size, memory_budget)
    check_int_range("checkpoint_every", checkpoint_every, 1)
    tokens = _prompt_tokens(model, prompts, fit.max_seq_len)
    dt = compute_dtype(model)
    lens_dt = torch.float64 if dt == torch.float64 else torch.float32
    basis = stream_basis(model)
    meta = _metadata(model, fit, corpus, metadata, 0, basis)
    path = None if checkpoint is None else Path(checkpoint)
    S, done, start = torch.zeros(len(fit.source_layers), fit.d_model, fit.d_model, dtype=torch.float64), 0, 0
    if path is not None and resume and path.exists():
        S, done, start = _resume(path, fit, dt)
    with preserve_state(model), _Frozen(model):
        for i in bar(range(start, len(tokens)), desc="J-lens fit", enabled=progress, unit="prompt"):
            t = tokens[i]
            if t.shape[1] <= fit.skip_first + 1:
                warnings.warn(f"prompt {i} has {t.shape[1]} tokens, no valid position past skip_first={fit.skip_first} "
                              "and before the last: skipped", stacklevel=2)
            else:
                S += _prompt_jacobians(model, t, fit, dt).to(torch.float64)
                done += 1
            if path is not None and ((i + 1) % checkpoint_every == 0 or i + 1 == len(tokens)):
                _write_checkpoint(path, S, done, i + 1, fit, lens_dt, meta | {"n_prompts": done})
    if done == 0:
        raise ValueError(f"no prompt has more than skip_first + 1 = {fit.skip_first + 1} tokens: nothing was fitted")
    return JacobianLens((S / done).to(lens_dt), fit.source_layers, n_prompts=done, metadata=meta | {"n_prompts": done})


# --- the readout ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class JacobianLensReadings:
    """What the Jacobian lens read (:func:`jacobian_lens`); the fields are :class:`rs_interp.LogitLensReadings`'s.

    Attributes:
        labels: the reading points: ``"embed"`` (read as the logit lens reads it: the reference fits no matrix
            there), ``"L{l}"`` after each source layer (through ``J_l``), and the last block's ``"L{n-1}"``
            (read as the model reads it).
        transported: per point, whether a matrix ``J_l`` carried it.
        target_probs: (point, batch, pos) probability of ``targets`` (NaN where a target is -1), or None.
        top_tokens: (point, batch, pos, k) most probable token ids.
        top_probs: (point, batch, pos, k) their probabilities.
        entropy: (point, batch, pos) entropy in nats.
        log_probs: (point, batch, pos, d_vocab) full log-distributions, only with ``full=True``.

    >>> import rs_interp as ri
    >>> model = ri.load_toy_model("induction-2l")
    >>> toks = ri.induction_batch(2, seed=0).tokens
    >>> lens = ri.fit_jacobian_lens(model, toks, skip_first=4, progress=False)
    >>> readings = ri.jacobian_lens(model, toks, lens, k=3)
    >>> readings.labels, readings.transported, [len(t) for _, t in readings.top(2, position=-1)]
    (('embed', 'L0', 'L1'), (False, True, False), [2, 2, 2])
    """

    labels: tuple[str, ...]
    transported: tuple[bool, ...]
    target_probs: torch.Tensor | None
    top_tokens: torch.Tensor
    top_probs: torch.Tensor
    entropy: torch.Tensor
    log_probs: torch.Tensor | None = None

    def top(self, k: int = 5, *, position: int = -1, batch: int = 0) -> list[tuple[str, list[tuple[int, float]]]]:
        """Each reading point's ``k`` most probable tokens at one position:
        ``(label, [(token id, probability), ...])``."""
        k = check_int_range("k", k, 1, self.top_tokens.shape[-1])
        ids, probs = self.top_tokens[:, batch, position, :k], self.top_probs[:, batch, position, :k]
        return [(label, [(int(i), round(float(p), 4)) for i, p in zip(ids[j], probs[j])])
                for j, label in enumerate(self.labels)]


def jacobian_lens(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    lens: JacobianLens,
    *,
    targets: Int[torch.Tensor, "batch pos"] | None = None,
    k: int = 5,
    full: bool = False,
    batch_chunk: int | None = None,
    row_chunk: int = 1024,
    vocab_tile: int = 4096,
    memory_budget: int = MEMORY_BUDGET,
) -> JacobianLensReadings:
    """Read the stream after each of the lens's source layers through its matrix and the model's own final norm,
    unembedding and soft-cap, ``softcap(N_final(J_l h) W_U + b_U)``; the embedding and the last block as the
    logit lens reads them.

    The decoding is :func:`rs_interp.logit_lens`'s (the same passes, tiles, online softmax and the same rows
    decoded together): with every ``J_l = I`` on every layer the readings are the logit lens's, bit for bit.
    The matrices are used in the model's basis (module docstring).

    Args:
        model: any ``Model``.
        tokens: (batch, pos) token ids.
        lens: a :class:`JacobianLens` of this model.
        targets, k, full, batch_chunk, row_chunk, vocab_tile, memory_budget: as :func:`rs_interp.logit_lens`.

    Raises:
        ValueError: the certificate cannot vouch for the readout (``readout``, ``stop at layer``,
            ``vocabulary``), or a lens of another model or basis (named).

    >>> import rs_interp as ri
    >>> model = ri.load_toy_model("induction-2l")
    >>> toks = ri.induction_batch(2, seed=0).tokens
    >>> lens = ri.fit_jacobian_lens(model, toks, skip_first=4, progress=False)
    >>> tuple(ri.jacobian_lens(model, toks, lens).top_tokens.shape)
    (3, 2, 48, 5)
    """
    tokens = check_tokens(model, tokens)
    cert = require(model, "jacobian_lens")
    J = in_model_basis(lens, model, "jacobian_lens")
    layers = (*lens.source_layers, model.cfg.n_layers - 1)
    points = [(lens_label(None), N.RESID0)] + [(lens_label(l), N.resid_post(l)) for l in layers]
    transports = {N.resid_post(l): J[i] for i, l in enumerate(lens.source_layers)}
    out = read_points(model, tokens, points, transports, cert, targets=targets, k=k, full=full, batch_chunk=batch_chunk,
                      row_chunk=row_chunk, vocab_tile=vocab_tile, memory_budget=memory_budget)
    return JacobianLensReadings(labels=out.labels, transported=tuple(name in transports for _, name in points),
                                target_probs=out.target_probs, top_tokens=out.top_tokens, top_probs=out.top_probs,
                                entropy=out.entropy, log_probs=out.log_probs)
