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
>>> lens = ri.fit_jacobian_lens(model, ri.induction_batch(2, seed=0).tokens, skip_first=4, progress=False)
>>> lens.source_layers, tuple(lens.jacobians.shape)
((0,), (1, 32, 32))
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from jaxtyping import Float

from .._files import FileError, check_shape, parsing, read_torch
from .._messages import few

__all__ = ["JacobianLens", "SKIP_FIRST", "MAX_SEQ_LEN", "ESTIMATOR", "RAW", "CENTRED"]

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
            raise ValueError(f"layer {layer} is not one of this lens's source layers {few(self.source_layers)}.")
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
        check_metadata(self.metadata)
        payload = {"J": {int(l): m.to(dtype) for l, m in zip(self.source_layers, self.jacobians)},
                   "n_prompts": int(self.n_prompts), "source_layers": list(self.source_layers), "d_model": self.d_model}
        if self.metadata:
            payload["metadata"] = self.metadata
        return atomic_save(payload, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "JacobianLens":
        """Read a lens file (``J``: the reference's, TransformerLens 4.3's or rs_interp's) or a fit checkpoint
        (``jacobian_sum`` and ``n_done``: the running sum, divided here by the prompts done).

        Raises:
            rs_interp.FileError: (a ``ValueError``) the file missing, truncated, not a PyTorch file, neither kind of
                file, a checkpoint with no prompt done, or matrices that are not one square ``d_model`` per layer.
        """
        what = "Jacobian lens file"
        payload = read_torch(path, what)
        with parsing(path, what):
            if not isinstance(payload, dict):
                raise FileError(f"{what} {path} holds a {type(payload).__name__}, not a lens's dictionary.", path)
            meta = dict(payload.get("metadata") or {})
            if "J" in payload:
                return cls(_stacked(payload["J"], path, payload.get("d_model")), _layers(payload["J"]),
                           n_prompts=int(payload.get("n_prompts", 0)), metadata=meta)
            if "jacobian_sum" in payload:
                return cls._from_checkpoint(payload, meta, path)
        raise FileError(f"{what} {path} is neither a lens (a 'J' key) nor a fit checkpoint ('jacobian_sum'): its keys "
                        f"are {few(sorted(map(str, payload)))}.", path)

    @classmethod
    def _from_checkpoint(cls, payload: dict, meta: dict, path: str | os.PathLike) -> "JacobianLens":
        done = int(payload.get("n_done", 0))
        if done <= 0 or not payload["jacobian_sum"]:
            raise FileError(f"Jacobian lens file {path} is a fit checkpoint with no prompt done (n_done={done}): "
                            "nothing to average.", path)
        sums = payload["jacobian_sum"]
        J = _stacked(sums, path, None)
        for key in ("target_layer", "skip_first", "model_name", "corpus"):
            if key in payload and key not in meta:
                meta[key] = payload[key]
        return cls((J.double() / done).to(J.dtype), _layers(sums), n_prompts=done, metadata=meta)

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


def _layers(matrices: dict) -> tuple[int, ...]:
    return tuple(sorted(int(l) for l in matrices))


def _stacked(matrices: dict, path: str | os.PathLike, d_model: int | None) -> torch.Tensor:
    """The file's {layer: matrix} as (layer, d, d) in layer order, float64 if stored so, else float32; each checked
    square of the same width (``d_model`` where the file says it)."""
    if not matrices:
        raise FileError(f"Jacobian lens file {path} holds no matrix.", path)
    first = matrices[next(iter(matrices))]
    d = int(d_model) if d_model is not None else int(first.shape[-1])
    for layer, matrix in matrices.items():
        check_shape(matrix, (d, d), f"J[{layer}]", path, "Jacobian lens file")
    return torch.stack([_widened(matrices[l]) for l in sorted(matrices, key=int)])


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


def check_metadata(meta: Any, where: str = "metadata") -> None:
    """What ``torch.load(weights_only=True)`` reads back: None, bool, int, float, str, and lists, tuples
    and string-keyed dicts of them."""
    if meta is None or type(meta) in (bool, int, float, str):
        return
    if type(meta) in (list, tuple):
        for i, item in enumerate(meta):
            check_metadata(item, f"{where}[{i}]")
        return
    if type(meta) is dict:
        for key, item in meta.items():
            if type(key) is not str:
                raise ValueError(f"{where} has a key {key!r} that is not a string")
            check_metadata(item, f"{where}.{key}")
        return
    raise ValueError(f"{where} holds a {type(meta).__name__}: a lens file keeps None, bool, int, float, str, lists "
                     "and dicts")


def atomic_save(payload: dict, path: str | os.PathLike) -> Path:
    """``torch.save`` to a file beside ``path``, then renamed onto it: a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    torch.save(payload, tmp)
    os.replace(tmp, path)
    return path
