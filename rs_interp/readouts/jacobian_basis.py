"""The basis of a model's residual stream, and a Jacobian lens carried into it (:mod:`rs_interp.readouts.jacobian_lens`,
"Bases").

TransformerLens's ``center_writing_weights`` makes every write into the stream mean-free: the processed stream is
``P h``, ``P = I - 1 1^T / d_model``. Where every reader of the stream subtracts its mean (LayerNorm), the writes of
the processed model are ``P`` times the raw ones and read the stream through ``P``, so per prompt and position pair
``d h'_final / d h'_l = I + P (d h_final / d h_l - I)``: the processed model's lens is exactly ``J' = P J + (I - P)``
of the raw model's ``J`` (the estimator is linear in those blocks). The map is the identity on a lens already
fitted on a centred stream. The other way is not determined: a centred lens lost the raw lens's mean row.

>>> import rs_interp as ri
>>> stream_basis(ri.load_toy_model("induction-2l"))
'raw'
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float

from .. import _backend
from .. import _names as N
from .._backend import Model
from .._messages import few
from .._state import preserve_state
from ..exact.readout import compute_dtype, final_norm_of
from ..exact.stream import record
from .jacobian_lens import CENTRED, RAW, JacobianLens

__all__ = ["stream_basis", "in_model_basis"]


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
    >>> stream_basis(ri.load_toy_model("tracr-reverse"))
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
        raise ValueError(f"{helper}: the lens has source layers {few(lens.source_layers)}; this "
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
