"""The options of an attribution estimate as one frozen, validated value.

Edge and node attribution patching (:func:`rs_interp.edge_attribution_patching`,
:func:`rs_interp.attribution_patching`) and the methods registry (:mod:`rs_interp.circuits.methods`) take the
same six options; :class:`EstimateOptions` holds them, checked once when the value is built (a ValueError that
names the bad field, or the two options that do not combine), and derives what the passes need from them: the
points of the line and their weights (:attr:`EstimateOptions.line`). The public helpers keep their keyword
arguments and build the value from them.

>>> EstimateOptions(ig_steps=2, correction="hessian").line
Line(alphas=[0.0, 0.5], weights=[0.5, 0.5], seconds=[0.125, 0.125])
>>> EstimateOptions(qk_fix=1)
Traceback (most recent call last):
...
ValueError: qk_fix must be True or False, got 1
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from .correction import quadrature

__all__ = ["EstimateOptions", "Line", "check_options"]


class Line(NamedTuple):
    """Where the gradient passes run and how each is weighted (:func:`rs_interp.circuits.correction.quadrature`)."""

    alphas: list[float]  # the points on the line from the reference's input embedding (0) to the run's (1)
    weights: list[float]  # the weight of each point's gradient
    seconds: list[float]  # the weight of each point's derivative along the line (the Hessian term; zeros without it)


def check_options(ig_steps: int | None, qk_fix: bool, grad_drop: bool, correction: str | None,
                  per_example: bool) -> None:
    """Refuse the combinations that have no single definition (named)."""
    for name, value in (("qk_fix", qk_fix), ("grad_drop", grad_drop), ("per_example", per_example)):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False, got {value!r}")
    if (qk_fix or grad_drop) and (ig_steps is not None or correction is not None):
        raise ValueError("the QK fix and GradDrop (AtP*) correct the gradient at the run itself: they do not combine "
                         "with ig_steps or correction (run them as separate estimates)")
    if grad_drop and per_example:
        raise ValueError("GradDrop scores the sum of |estimate| over its passes: it has no per-pair shares "
                         "(per_example); bootstrap the plain or QK-fixed estimate instead")


@dataclass(frozen=True)
class EstimateOptions:
    """How an attribution estimate is computed: one frozen value, validated when built.

    Attributes:
        ig_steps, ig_rule: ``m`` of EAP-IG and which ``m`` points (``"left"``, ``"right"``, ``"gauss"``); None:
            plain attribution patching (the gradient at the run).
        qk_fix, grad_drop: AtP*'s options (:mod:`rs_interp.circuits.atp_star`).
        correction: ``"hessian"`` (:mod:`rs_interp.circuits.correction`) or None.
        per_example: keep each pair's share of the estimate (error bars).

    Raises:
        ValueError: a bad value (naming its field) or two options that do not combine (naming both).

    Example:
        >>> options = EstimateOptions(ig_steps=3)
        >>> options.line.alphas, options.hessian, options.keywords()["ig_rule"]
        ([0.0, 0.3333333333333333, 0.6666666666666666], False, 'left')
        >>> EstimateOptions(correction="newton")
        Traceback (most recent call last):
        ...
        ValueError: correction must be one of (None, 'hessian'), got 'newton'
    """

    ig_steps: int | None = None
    ig_rule: str = "left"
    qk_fix: bool = False
    grad_drop: bool = False
    correction: str | None = None
    per_example: bool = False

    def __post_init__(self) -> None:
        # The order of the checks is the helpers' (the refusals they have always given, word for word).
        quadrature(self.ig_steps, self.ig_rule, self.correction)
        check_options(self.ig_steps, self.qk_fix, self.grad_drop, self.correction, self.per_example)

    @property
    def line(self) -> Line:
        """The points of the line and their weights (:func:`rs_interp.circuits.correction.quadrature`)."""
        return Line(*quadrature(self.ig_steps, self.ig_rule, self.correction))

    @property
    def hessian(self) -> bool:
        """The second-order term is added (``correction="hessian"``)."""
        return self.correction == "hessian"

    @property
    def plain_run(self) -> bool:
        """One first-order pass at the run itself: the run's activations are read in that pass."""
        return self.line.alphas == [1.0] and not self.hessian

    def keywords(self) -> dict[str, Any]:
        """The options as the helpers' keyword arguments."""
        return {"ig_steps": self.ig_steps, "ig_rule": self.ig_rule, "qk_fix": self.qk_fix, "grad_drop": self.grad_drop,
                "correction": self.correction, "per_example": self.per_example}
