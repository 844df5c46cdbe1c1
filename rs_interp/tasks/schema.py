"""A task's position schema: named spans of positions, aligning prompts of different lengths (PEAP's spans).

It belongs to the task (the prompts' parts: the subject, the verb, the end) and the methods read it
(:mod:`rs_interp.circuits.positions`'s position-aware edges), so it lives below them, with the tasks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
from jaxtyping import Float, Int

__all__ = ["PositionSchema"]


@dataclass(frozen=True)
class PositionSchema:
    """Named spans of positions (module docstring).

    Attributes:
        names: the spans, in their order along every row.
        span_of: (batch, pos) the span of each position of each row, in ``[0, len(names))``.

    Raises:
        ValueError: a span index out of range, spans out of order along a row, names not distinct strings.

    Example:
        >>> import torch
        >>> s = PositionSchema.each(torch.zeros(2, 3, dtype=torch.long))
        >>> s.names, s.span_of.tolist()
        (('0', '1', '2'), [[0, 1, 2], [0, 1, 2]])
    """

    names: tuple[str, ...]
    span_of: Int[torch.Tensor, "batch pos"] = field(repr=False)

    def __post_init__(self) -> None:
        names = tuple(self.names)
        if not names or not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
            raise ValueError(f"a schema's span names must be distinct strings, got {self.names!r}")
        object.__setattr__(self, "names", names)
        s = self.span_of
        if not isinstance(s, torch.Tensor) or s.ndim != 2 or s.dtype != torch.long:
            raise ValueError("span_of must be a (batch, pos) torch.long tensor")
        if bool(((s < 0) | (s >= len(names))).any()):
            raise ValueError(f"span_of must give every position a span in [0, {len(names)}): every position is in "
                             "exactly one span")
        if s.shape[1] > 1 and bool((s[:, 1:] < s[:, :-1]).any()):
            raise ValueError("the spans must come in order along every row (span_of non-decreasing along the "
                             "positions)")

    @property
    def n_spans(self) -> int:
        return len(self.names)

    @classmethod
    def each(cls, tokens: torch.Tensor) -> "PositionSchema":
        """Every position its own span, named by its index (prompts of one length)."""
        B, P = tokens.shape
        return cls(tuple(str(p) for p in range(P)), torch.arange(P).expand(B, P).clone())

    @classmethod
    def from_starts(cls, names: Sequence[str], starts: Sequence[Sequence[int]], width: int) -> "PositionSchema":
        """PEAP's format: per row, the first position of each span (a span ends where the next starts; the
        last runs to ``width``; equal starts make an empty span).

        >>> PositionSchema.from_starts(("a", "b", "c"), [[0, 2, 2]], 4).span_of.tolist()
        [[0, 0, 2, 2]]
        """
        rows = []
        for r in starts:
            r = list(r)
            if len(r) != len(names) or r[0] != 0 or any(b < a for a, b in zip(r, r[1:])) or r[-1] > width:
                raise ValueError(f"each row's starts must be {len(names)} non-decreasing positions from 0 to at most "
                                 f"{width}, got {r}")
            row = torch.zeros(width, dtype=torch.long)
            for i, start in enumerate(r):
                row[start:] = i
            rows.append(row)
        return cls(tuple(names), torch.stack(rows))

    def check(self, tokens: torch.Tensor) -> "PositionSchema":
        """``self``, checked to be a schema of ``tokens`` (the same (batch, pos))."""
        if tuple(self.span_of.shape) != tuple(tokens.shape):
            raise ValueError(f"the schema's span_of has shape {tuple(self.span_of.shape)}, the tokens "
                             f"{tuple(tokens.shape)}: a schema gives a span to every position of every row")
        return self

    def one_hot(self, dtype: torch.dtype = torch.float64) -> Float[torch.Tensor, "batch pos span"]:
        """(batch, pos, span): 1 where the position is in the span."""
        return torch.nn.functional.one_hot(self.span_of, self.n_spans).to(dtype)

    def rows(self, index: torch.Tensor | slice) -> "PositionSchema":
        """The schema of some rows (a batch of a dataset)."""
        return PositionSchema(self.names, self.span_of[index])

    def index(self, span: str) -> int:
        if span not in self.names:
            raise ValueError(f"{span!r} is not a span of this schema {self.names}")
        return self.names.index(span)
