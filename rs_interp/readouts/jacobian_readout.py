"""Reading the stream through a Jacobian lens (:mod:`rs_interp.readouts.jacobian_lens`): after each source layer
``softcap(N_final(J_l h) W_U + b_U)``, with the logit lens's decoding (:func:`rs_interp.logit_lens`).

>>> import rs_interp as ri
>>> model = ri.load_toy_model("induction-2l")
>>> toks = ri.induction_batch(2, seed=0).tokens
>>> readings = jacobian_lens(model, toks, ri.fit_jacobian_lens(model, toks, skip_first=4, progress=False))
>>> readings.labels
('embed', 'L0', 'L1')
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Int

from .. import _names as N
from .._backend import Model
from .._budget import MEMORY_BUDGET
from ..exact.certificate import require
from ..exact.needs import LENS_ONE_PASS, needs
from ..exact.validate import check_int_range, check_tokens
from ..labels import lens_label
from .jacobian_basis import in_model_basis
from .jacobian_lens import JacobianLens
from .lens import LogitLensReadings, read_points

__all__ = ["JacobianLensReadings", "jacobian_lens"]


@dataclass(frozen=True)
class JacobianLensReadings(LogitLensReadings):
    """What the Jacobian lens read (:func:`jacobian_lens`): :class:`rs_interp.LogitLensReadings`'s fields (``labels``,
    ``target_probs``, ``top_tokens``, ``top_probs``, ``entropy``, ``log_probs``), at the reading points ``"embed"``
    (read as the logit lens reads it: the reference fits no matrix there), ``"L{l}"`` after each source layer (through
    ``J_l``) and the last block's ``"L{n-1}"`` (read as the model reads it), and which of them a matrix carried.

    Attributes:
        transported: per point, whether a matrix ``J_l`` carried it.

    >>> import rs_interp as ri
    >>> model = ri.load_toy_model("induction-2l")
    >>> toks = ri.induction_batch(2, seed=0).tokens
    >>> lens = ri.fit_jacobian_lens(model, toks, skip_first=4, progress=False)
    >>> readings = ri.jacobian_lens(model, toks, lens, k=3)
    >>> readings.labels, readings.transported, [len(t) for _, t in readings.top(2, position=-1)]
    (('embed', 'L0', 'L1'), (False, True, False), [2, 2, 2])
    """

    transported: tuple[bool, ...] = ()

    def top(self, k: int = 5, *, position: int = -1, batch: int = 0) -> list[tuple[str, list[tuple[int, float]]]]:
        """Each reading point's ``k`` most probable tokens at one position:
        ``(label, [(token id, probability), ...])``."""
        k = check_int_range("k", k, 1, self.top_tokens.shape[-1])
        ids, probs = self.top_tokens[:, batch, position, :k], self.top_probs[:, batch, position, :k]
        return [(label, [(int(i), round(float(p), 4)) for i, p in zip(ids[j], probs[j])])
                for j, label in enumerate(self.labels)]


@needs("readout", "stop at layer", "vocabulary", adapts=LENS_ONE_PASS)
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
