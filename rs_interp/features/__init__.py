"""Feature circuits: transcoders, attribution graphs over their features, and interventions.

>>> import torch
>>> from rs_interp import load_toy_model
>>> from rs_interp.features import attribution_graph, shipped_transcoders
>>> g = attribution_graph(load_toy_model("code-2l"), shipped_transcoders("code-2l"), torch.arange(50, 58), targets=[58])
>>> g.n_layers, g.n_pos
(2, 8)
"""

from .._lazy import attach
from .attribution import attribution_graph
from .clt import SHIPPED_CLTS, CrossLayerTranscoder, TrainedCLT, load_clt, shipped_clt, train_clt
from .estimate import GraphEstimate, estimate_graph
from .graph import AttributionGraph, GraphScores, PrunedGraph
from .interventions import Intervention, intervene
from .qk import QKAttribution, qk_attributions, top_attention
from .supernodes import SupernodeGraph, same_feature_groups
from .training import TrainedTranscoders, TranscoderMetrics, train_transcoder, transcoder_metrics
from .transcoders import (
    SHIPPED_TRANSCODERS,
    Transcoder,
    TranscoderSet,
    load_transcoders,
    mlp_transcoders,
    shipped_metrics,
    shipped_transcoders,
)

__all__ = [
    "Transcoder",
    "TranscoderSet",
    "load_transcoders",
    "mlp_transcoders",
    "shipped_transcoders",
    "shipped_metrics",
    "SHIPPED_TRANSCODERS",
    "attribution_graph",
    "AttributionGraph",
    "PrunedGraph",
    "GraphScores",
    "intervene",
    "Intervention",
    "qk_attributions",
    "estimate_graph",
    "CrossLayerTranscoder",
    "load_clt",
    "train_clt",
    "TrainedCLT",
    "shipped_clt",
    "SHIPPED_CLTS",
    "SupernodeGraph",
    "same_feature_groups",
    "GraphEstimate",
    "top_attention",
    "QKAttribution",
    "train_transcoder",
    "TrainedTranscoders",
    "transcoder_metrics",
    "TranscoderMetrics",
]

#: Every submodule answers as an attribute (``rs_interp.features.export``), imported on first use.
__getattr__, __dir__ = attach(__name__, {}, globals())
