"""Causal variables: where a model holds a variable of a high-level causal model, found by interchange
interventions on linear subspaces and by distributed alignment search (DAS), checked on the tracr models,
whose variables are known in advance.

- :mod:`.bases`: orthonormal bases (checked, extracted, class-mean, probe, random, neuron);
- :mod:`.kernel`: the projection kernel between subspaces and its random reference moments;
- :mod:`.sites`: the hook points an interchange acts on;
- :mod:`.causal`: high-level causal models and their counterfactuals; :mod:`.pairs`: pair sets;
- :mod:`.interchange`: interchange interventions, the norm-matched placebo, accuracy and effect;
- :mod:`.das`: DAS, with its controls (arbitrary labels, an untrained copy of the model);
- :mod:`.tracr_models`: the shipped tracr programs as causal models, and where tracr put each variable;
  :mod:`.tracr_pair_sets`: their pair sets;
- :mod:`.task_models`: causal models and pair sets of induction, IOI, greater-than and subject-verb agreement.

>>> import rs_interp as ri
>>> from rs_interp.variables import interchange, tracr_pairs, tracr_variables
>>> var = tracr_variables("tracr-sort")["target_pos_3"]
>>> model = ri.load_toy_model("tracr-sort")
>>> interchange(model, tracr_pairs("tracr-sort", var.name, n=8), var.site, var.basis(model.cfg.d_model)).accuracy
1.0
"""

from .bases import (
    check_basis,
    mean_difference_basis,
    neuron_basis,
    orthonormal_basis,
    probe_basis,
    random_basis,
    random_neuron_basis,
)
from .causal import CausalModel, Variable
from .controls import untrained_copy
from .das import CONTROLS, DAS, DASFit, DASOptions, das
from .interchange import Interchange, NormMatchedPlacebo, SubspaceInterchange, activations, interchange
from .kernel import KernelMoments, ProjectionKernel, projection_kernel, random_kernel_moments
from .pairs import PairSet, arbitrary_labels
from .sites import Site
from .task_models import (
    greater_than_causal_model,
    greater_than_pairs,
    induction_causal_model,
    induction_pairs,
    ioi_causal_model,
    ioi_pairs,
    sva_causal_model,
    sva_pairs,
)
from .tracr_models import TracrVariable, tracr_causal_model, tracr_inputs, tracr_variables
from .tracr_pair_sets import tracr_pairs

__all__ = [
    "check_basis",
    "orthonormal_basis",
    "mean_difference_basis",
    "probe_basis",
    "random_basis",
    "neuron_basis",
    "random_neuron_basis",
    "projection_kernel",
    "ProjectionKernel",
    "random_kernel_moments",
    "KernelMoments",
    "Site",
    "CausalModel",
    "Variable",
    "PairSet",
    "arbitrary_labels",
    "interchange",
    "Interchange",
    "activations",
    "SubspaceInterchange",
    "NormMatchedPlacebo",
    "das",
    "DAS",
    "DASFit",
    "DASOptions",
    "CONTROLS",
    "untrained_copy",
    "tracr_causal_model",
    "tracr_variables",
    "TracrVariable",
    "tracr_pairs",
    "tracr_inputs",
    "induction_causal_model",
    "induction_pairs",
    "ioi_causal_model",
    "ioi_pairs",
    "greater_than_causal_model",
    "greater_than_pairs",
    "sva_causal_model",
    "sva_pairs",
]
