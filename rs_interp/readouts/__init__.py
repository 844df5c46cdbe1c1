"""Readouts of the logits: what the residual stream says about the output, split exactly.

- :mod:`.attribution`: first-order direct logit attribution (each token's final-norm scale frozen);
- :mod:`.second_order`: attribution over paths source -> head -> logit, on models with norms and MLPs;
- :mod:`.paths`: Theorem 3's exact path expansion of attention-only logits, and its attribution to paths;
- :mod:`.lens`: the logit lens; :mod:`.tuned_lens`: the tuned lens (a learned translator per reading point).

The everyday readouts are ``rs_interp``'s (``rs_interp.logit_lens``, ...); the result types and the Jacobian lens's
interventions and J-space are named here (``rs_interp.readouts.jspace_decomposition``). ``import rs_interp`` does not
load this package: it is imported on the first use of a readout.
"""

from typing import TYPE_CHECKING

from .._lazy import attach

#: The names public here only, each with its module, imported on first use (rs_interp._lazy).
_WHERE: dict[str, str] = {
    "DirectLogitAttribution": ".attribution",
    "PathAttribution": ".paths",
    "PathExpansion": ".paths",
    "SecondOrderAttribution": ".second_order",
    "LogitLensReadings": ".lens",
    "JacobianLensReadings": ".jacobian_readout",
    "lens_vectors": ".lens_interventions",
    "lens_steering_hooks": ".lens_interventions",
    "lens_ablation_hooks": ".lens_interventions",
    "lens_swap_hooks": ".lens_interventions",
    "JSpaceDecomposition": ".jspace",
    "jspace_decomposition": ".jspace",
    "JSpaceOccupancy": ".jspace_measures",
    "jspace_occupancy": ".jspace_measures",
    "JSpaceVariance": ".jspace_measures",
    "jspace_variance": ".jspace_measures",
}

if TYPE_CHECKING:  # for type checkers and the documentation
    from .attribution import DirectLogitAttribution
    from .jacobian_readout import JacobianLensReadings
    from .jspace import JSpaceDecomposition, jspace_decomposition
    from .jspace_measures import JSpaceOccupancy, JSpaceVariance, jspace_occupancy, jspace_variance
    from .lens import LogitLensReadings
    from .lens_interventions import lens_ablation_hooks, lens_steering_hooks, lens_swap_hooks, lens_vectors
    from .paths import PathAttribution, PathExpansion
    from .second_order import SecondOrderAttribution

# imported now, not on first use: the function ``coordinate_patch`` has its module's name, which importing the module
# would otherwise set on this package in its place (tests/integration/test_imports.py, no lazy name shadowed)
from .coordinate_patch import CoordinatePatch, coordinate_patch, coordinate_patch_hooks  # noqa: E402

#: Every other submodule answers as an attribute (``rs_interp.readouts.lens``), imported on first use.
__getattr__, __dir__ = attach(__name__, _WHERE, globals())

__all__ = [
    "DirectLogitAttribution", "PathAttribution", "PathExpansion", "SecondOrderAttribution", "LogitLensReadings",
    "JacobianLensReadings", "lens_vectors", "lens_steering_hooks", "lens_ablation_hooks", "lens_swap_hooks",
    "JSpaceDecomposition", "jspace_decomposition", "JSpaceOccupancy", "jspace_occupancy", "JSpaceVariance",
    "jspace_variance", "CoordinatePatch", "coordinate_patch", "coordinate_patch_hooks",
]
