"""Pair sets: base and source inputs, where to intervene, where to read, and the high-level model's labels.

A :class:`PairSet` row is one interchange: the model runs on ``base``, its activation at the site (at
``base_positions``, or every position) takes the source's (from the run on ``source``, at
``source_positions``) inside a subspace, and the logits at position ``read`` of the base are read as a
choice among classes: the row's ``candidates`` (logit indices, e.g. token ids; -1 pads a short row), or,
for a numerical output (tracr's ``frac_prevs``), the single logit read against ``values`` (class ``c``'s
task logit is ``-(x - values[c])^2 / tau``, ``tau`` a quarter of the smallest gap squared: nearest value
wins). ``labels`` is the class the high-level causal model gives the base with the variable taken from the
source, ``base_labels`` the class it gives the base alone.

Rows may have different lengths (right-padded, ``base_lengths`` / ``source_lengths``): the runs group
rows by length and never feed padding to the model, so models with bidirectional attention (tracr's)
are run exactly. ``several`` marks the rows whose base and source differ in other variables too (DAS
needs both kinds: otherwise a subspace can learn whatever the pairs move together).

>>> pairs = PairSet(base=torch.tensor([[1, 2, 3]]), source=torch.tensor([[1, 4, 3]]), labels=torch.tensor([1]),
...                 base_labels=torch.tensor([0]), read=torch.tensor([2]), candidates=torch.tensor([[5, 6]]),
...                 base_positions=torch.tensor([1]), source_positions=torch.tensor([1]))
>>> len(pairs), pairs.n_classes, pairs.groups()
(1, 2, {(3, 3): [0]})
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields, replace
from typing import Hashable, Sequence

import torch
from jaxtyping import Bool, Float, Int

from ..exact.validate import as_int

__all__ = ["PairSet", "arbitrary_labels"]

_ROW_FIELDS = ("labels", "base_labels", "read", "base_positions", "source_positions", "base_lengths", "source_lengths",
               "several")


@dataclass(frozen=True, eq=False)
class PairSet:
    """Interchange pairs with their counterfactual labels (module docstring).

    Attributes:
        base: (batch, pos) base token ids (right-padded where ``base_lengths`` says).
        source: (batch, pos_s) source token ids.
        labels: (batch,) the counterfactual class of each row (an index into its candidates or ``values``).
        base_labels: (batch,) the class of the base alone.
        read: (batch,) the base position whose logits are read.
        candidates: (batch, k) logit indices per row, -1 padding; None for a numerical output.
        values: (k,) the numerical output's classes (its single logit is read against them); else None.
        base_positions, source_positions: (batch,) where to intervene in the base and read the source;
            both None: every position (base and source as long, row by row).
        base_lengths, source_lengths: (batch,) each row's length; None: the full width.
        several: (batch,) True where base and source differ in more variables than the aligned one.
        variable: the aligned variable's name.
        keys: one hashable per row naming its source (the arbitrary-label control draws a class per key);
            None: the source's tokens and position.

    Raises:
        ValueError: mismatched shapes, classes out of range, positions or reads outside the rows' lengths,
            both or neither of ``candidates`` and ``values``, one of the position tensors without the other.
    """

    base: Int[torch.Tensor, "batch pos"]
    source: Int[torch.Tensor, "batch pos_s"]
    labels: Int[torch.Tensor, " batch"]
    base_labels: Int[torch.Tensor, " batch"]
    read: Int[torch.Tensor, " batch"]
    candidates: Int[torch.Tensor, "batch k"] | None = None
    values: Float[torch.Tensor, " k"] | None = None
    base_positions: Int[torch.Tensor, " batch"] | None = None
    source_positions: Int[torch.Tensor, " batch"] | None = None
    base_lengths: Int[torch.Tensor, " batch"] | None = None
    source_lengths: Int[torch.Tensor, " batch"] | None = None
    several: Bool[torch.Tensor, " batch"] | None = None
    variable: str = ""
    keys: tuple[Hashable, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("base", "source"):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or t.ndim != 2 or t.is_floating_point() or 0 in t.shape:
                raise ValueError(f"PairSet.{name} must be a non-empty 2-D integer tensor (batch, pos), got "
                                 f"{_shape(t)}")
        n = self.base.shape[0]
        if self.source.shape[0] != n:
            raise ValueError(f"PairSet.source has {self.source.shape[0]} rows, base {n}: one source per base")
        for name in _ROW_FIELDS:
            t = getattr(self, name)
            if t is not None and (not isinstance(t, torch.Tensor) or t.shape != (n,)):
                raise ValueError(f"PairSet.{name} must be a ({n},) tensor, one entry per pair, got {_shape(t)}")
        self._check_classes(n)
        self._check_positions()
        if self.keys is not None and len(self.keys) != n:
            raise ValueError(f"PairSet.keys has {len(self.keys)} entries for {n} pairs")

    def _check_classes(self, n: int) -> None:
        if (self.candidates is None) == (self.values is None):
            raise ValueError("PairSet needs exactly one of candidates (logit indices per row) and values (a numerical "
                             "output)")
        if self.candidates is not None:
            c = self.candidates
            if not isinstance(c, torch.Tensor) or c.ndim != 2 or c.shape[0] != n or c.is_floating_point():
                raise ValueError(f"PairSet.candidates must be a ({n}, k) integer tensor, got {_shape(c)}")
            valid = (c >= 0).sum(1)
        else:
            v = self.values
            if not isinstance(v, torch.Tensor) or v.ndim != 1 or not v.is_floating_point() or len(v) < 2:
                raise ValueError(f"PairSet.values must be a 1-D floating tensor of at least 2 values, got {_shape(v)}")
            valid = torch.full((n,), len(v))
        for name in ("labels", "base_labels"):
            t = getattr(self, name)
            if t.is_floating_point() or bool(((t < 0) | (t >= valid)).any()):
                raise ValueError(f"PairSet.{name} must index a valid class of its row (0 <= label < the row's classes)")

    def _check_positions(self) -> None:
        if (self.base_positions is None) != (self.source_positions is None):
            raise ValueError("PairSet takes base_positions and source_positions together (or neither: every position)")
        b_len, s_len = self.lengths("base"), self.lengths("source")
        if (bool(((b_len < 1) | (b_len > self.base.shape[1])).any())
                or bool(((s_len < 1) | (s_len > self.source.shape[1])).any())):
            raise ValueError("PairSet lengths must lie in [1, the tensor's width]")
        if bool(((self.read < 0) | (self.read >= b_len)).any()):
            raise ValueError("PairSet.read must lie inside each base row's length")
        if self.base_positions is None:
            if not torch.equal(b_len, s_len):
                raise ValueError("PairSet without positions interchanges every position: base and source rows must be "
                                 "as long, row by row")
        elif bool(((self.base_positions < 0) | (self.base_positions >= b_len)).any()
                  or ((self.source_positions < 0) | (self.source_positions >= s_len)).any()):
            raise ValueError("PairSet.base_positions and source_positions must lie inside their rows' lengths")

    def __len__(self) -> int:
        return self.base.shape[0]

    @property
    def n_classes(self) -> int:
        """The number of classes a row chooses among (the widest row's)."""
        return self.candidates.shape[1] if self.candidates is not None else len(self.values)

    def lengths(self, side: str) -> Int[torch.Tensor, " batch"]:
        """Each row's length of ``"base"`` or ``"source"``."""
        if side not in ("base", "source"):
            raise ValueError(f"side must be 'base' or 'source', got {side!r}")
        given = self.base_lengths if side == "base" else self.source_lengths
        width = (self.base if side == "base" else self.source).shape[1]
        return given if given is not None else torch.full((len(self),), width, dtype=torch.long)

    def groups(self) -> dict[tuple[int, int], list[int]]:
        """``{(base length, source length): row indices}``, rows in order within each group."""
        out: dict[tuple[int, int], list[int]] = {}
        for i, key in enumerate(zip(self.lengths("base").tolist(), self.lengths("source").tolist())):
            out.setdefault(key, []).append(i)
        return out

    def subset(self, rows: Sequence[int] | torch.Tensor) -> "PairSet":
        """The pairs ``rows``, in that order (the same fields)."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        if idx.ndim != 1 or idx.numel() == 0:
            raise ValueError("subset needs a non-empty 1-D list of row indices")
        picked = {f.name: _take(getattr(self, f.name), idx) for f in fields(self)
                  if f.name not in ("values", "variable", "keys")}
        keys = None if self.keys is None else tuple(self.keys[i] for i in idx.tolist())
        return replace(self, **picked, keys=keys)

    def split(self, test: float = 0.25, *, seed: int = 0) -> tuple["PairSet", "PairSet"]:
        """``(train, test)``: a seeded random ``test`` fraction of the rows held out (its own generator).

        >>> pairs = PairSet(base=torch.zeros(8, 2, dtype=torch.long), source=torch.ones(8, 2, dtype=torch.long),
        ...                 labels=torch.zeros(8, dtype=torch.long), base_labels=torch.zeros(8, dtype=torch.long),
        ...                 read=torch.ones(8, dtype=torch.long), candidates=torch.tensor([[3, 4]] * 8))
        >>> [len(p) for p in pairs.split(0.25)]
        [6, 2]
        """
        n_test = round(float(test) * len(self))
        if not 0 < n_test < len(self):
            raise ValueError(f"test={test} holds out {n_test} of {len(self)} pairs: both parts must be non-empty")
        order = torch.randperm(len(self), generator=torch.Generator().manual_seed(as_int("seed", seed)))
        return self.subset(order[n_test:]), self.subset(order[:n_test])

    def with_labels(self, labels: Int[torch.Tensor, " batch"]) -> "PairSet":
        """The same pairs with other counterfactual labels (the arbitrary-label control's)."""
        return replace(self, labels=torch.as_tensor(labels, dtype=torch.long))

    def row_keys(self) -> tuple[Hashable, ...]:
        """The key of each row's source: ``keys`` if given, else the source's tokens and position."""
        if self.keys is not None:
            return self.keys
        lengths, pos = self.lengths("source").tolist(), self.source_positions
        return tuple((tuple(row[:n]), None if pos is None else int(pos[i]))
                     for i, (row, n) in enumerate(zip(self.source.tolist(), lengths)))

    def task_logits(self, logits: Float[torch.Tensor, "batch pos d_vocab"], rows: torch.Tensor | None = None
                    ) -> Float[torch.Tensor, "batch k"]:
        """The rows' class scores from the model's logits on their bases (``rows``: which rows ``logits``
        holds, default all): the candidates' logits at ``read`` (padding: ``-inf``), or, numerical, minus
        the squared distance of logit 0 to each value over ``tau`` (module docstring)."""
        idx = torch.arange(len(self)) if rows is None else rows
        at = logits[torch.arange(logits.shape[0], device=logits.device), self.read[idx].to(logits.device)]
        if self.values is not None:
            values = self.values.to(at.device, at.dtype)
            gap = (values.sort().values.diff().min() / 2) ** 2
            return -(at[:, :1] - values[None, :]) ** 2 / gap
        cand = self.candidates[idx].to(at.device)
        picked = at.gather(1, cand.clamp(min=0))
        return picked.masked_fill(cand < 0, float("-inf"))


def arbitrary_labels(pairs: PairSet, *, seed: int = 0) -> Int[torch.Tensor, " batch"]:
    """A fixed pseudo-random class per source key (:meth:`PairSet.row_keys`): labels for the arbitrary-label
    control, TransformerLens 4.3's ``arbitrary_targets`` rule (sha256 of ``f"{seed}:{key!r}"``), taken modulo
    each row's number of classes. Train DAS on them with the same pairs, rank and budget: the accuracy
    it reaches is what the method's expressivity alone gives.

    >>> pairs = PairSet(base=torch.zeros(3, 2, dtype=torch.long), source=torch.tensor([[1, 2], [1, 2], [2, 1]]),
    ...                 labels=torch.zeros(3, dtype=torch.long), base_labels=torch.zeros(3, dtype=torch.long),
    ...                 read=torch.ones(3, dtype=torch.long), candidates=torch.tensor([[3, 4, 5]] * 3))
    >>> a = arbitrary_labels(pairs, seed=1)
    >>> bool(a[0] == a[1]), bool(((a >= 0) & (a < 3)).all())
    (True, True)
    """
    classes = ((pairs.candidates >= 0).sum(1).tolist() if pairs.candidates is not None
               else [len(pairs.values)] * len(pairs))
    seed = as_int("seed", seed)

    def draw(key: Hashable, k: int) -> int:
        digest = hashlib.sha256(f"{seed}:{key!r}".encode()).digest()
        return int.from_bytes(digest[:8], "big") % k

    return torch.tensor([draw(key, k) for key, k in zip(pairs.row_keys(), classes)], dtype=torch.long)


def _take(t: torch.Tensor | None, idx: torch.Tensor) -> torch.Tensor | None:
    return None if t is None else t[idx]


def _shape(t: object) -> str:
    return f"a {tuple(t.shape)} {t.dtype} tensor" if isinstance(t, torch.Tensor) else type(t).__name__
