"""Circuits on the model's edge graph: which edges carry a behaviour, estimated, measured and evaluated.

Every method here works on one graph (:mod:`.graph`: the senders that write the residual stream, the
receivers that read it) and shares one substrate (:mod:`._substrate`: where senders write and
receivers read, the reference runs, the gradient passes). The methods are registered once
(:mod:`.methods`), so the ground truth, the reproduction, the benchmarks and the command line read
one list.

- :mod:`.graph`: :func:`edge_layout`, :class:`EdgeLayout`, :class:`EdgeEffects`;
- :mod:`.node_attribution`, :mod:`.edge_attribution`: first-order estimates (and EAP-IG), with the
  options of :mod:`.atp_star` (the QK fix, GradDrop) and :mod:`.correction` (the Hessian correction,
  Gauss-Legendre EAP-IG, screen-flag-fix);
- :mod:`.uncertainty`: per-pair shares, standard errors, reliability, the bootstrap, stability;
- :mod:`.relevance`: relevance patching (RelP), LRP's coefficients in place of the gradients;
- :mod:`.positions`: position-aware edges (per position or per span of a schema), their circuits;
- :mod:`.path_patching`: the exact effect of each edge; :mod:`.acdc`: ACDC, exact edge by edge;
- :mod:`.evaluation`: circuits, faithfulness and its curve;
- :mod:`.ungrouped`: grouped-query attention with one key/value edge per query head, MIB's graph of it;
- :mod:`.methods`: the registry of methods;
- :mod:`.mib_files`, :mod:`.mib_names`: circuits and edge scores in the MIB circuit track's graph files;
- :mod:`.ground_truth`, :mod:`.tracr`: models whose circuits are known, and how each method scores on them.
"""

from .._lazy import attach
from .acdc import ACDC, acdc
from .correction import Fixed, fix_unreliable
from .edge_attribution import EdgeAttributionPatching, edge_attribution_patching
from .evaluation import MIB_FRACTIONS, FaithfulnessCurve, MIBScores, evaluate_circuit, faithfulness_curve, mib_scores
from .graph import EdgeEffects, EdgeLayout, edge_layout
from .mib_files import MIBGraph, from_mib_edge, mib_edge_names, mib_importances, read_mib, write_mib, write_mib_circuits
from .node_attribution import AttributionPatching, attribution_patching
from .path_patching import PathPatching, path_patching
from .positions import PositionalEdgeEffects, PositionSchema
from .relevance import EdgeRelevancePatching, RelevancePatching, edge_relevance_patching, relevance_patching
from .selection import top_edges
from .uncertainty import Bootstrap, Stability, bootstrap, stability
from .ungrouped import ungroup_gqa

__all__ = [
    "EdgeLayout", "EdgeEffects", "edge_layout",
    "AttributionPatching", "attribution_patching",
    "EdgeAttributionPatching", "edge_attribution_patching",
    "PathPatching", "path_patching",
    "EdgeRelevancePatching", "RelevancePatching", "edge_relevance_patching", "relevance_patching",
    "PositionSchema", "PositionalEdgeEffects",
    "MIB_FRACTIONS", "FaithfulnessCurve", "MIBScores", "evaluate_circuit", "faithfulness_curve", "mib_scores",
    "top_edges",
    "ACDC", "acdc", "Fixed", "fix_unreliable", "Bootstrap", "Stability", "bootstrap", "stability",
    "ungroup_gqa",
    "MIBGraph", "write_mib", "read_mib", "write_mib_circuits", "mib_edge_names", "from_mib_edge", "mib_importances",
]

#: Every submodule answers as an attribute (``rs_interp.circuits.methods``), imported on first use.
__getattr__, __dir__ = attach(__name__, {}, globals())
