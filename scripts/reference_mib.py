"""Run MIB's circuit-track harness and EAP-IG (the reference code itself) on files rs_interp wrote.

Runs in the reference venv (scripts/test_references.sh makes it: TransformerLens 2.x, EAP-IG at the
commit MIB pins, MIB-circuit-track), never in rs_interp's: tests/integration/test_references.py calls it as

    $RS_REF_PYTHON scripts/reference_mib.py request.json

and reads the JSON it prints. The request names a model (``{"cfg": HookedTransformerConfig fields,
"state": state dict}`` in a .pt), the data (clean and corrupted token ids, the labels: correct and
wrong next-token ids) and jobs:

- ``attribute``: MIB's own EAP scores (``attribute(..., method="EAP")`` with MIB's ``logit_diff``,
  ``loss=True, mean=True``, as run_attribution.py calls it), written with EAP-IG's ``Graph.to_json``;
- ``curve``: MIB's ``evaluate_area_under_curve`` on a graph file (faithfulness, weighted edge counts, areas);
- ``evaluate``: EAP-IG's ``evaluate_graph`` of a graph file as it is (its circuit), mean over examples.

Two things are adapted, neither in what is computed: the data are token ids, not strings (EAP-IG's
``tokenize_plus`` is replaced by one that returns them with a full attention mask: every prompt has the
same length, no padding), and EAP-IG's hard-coded ``device='cuda'`` is ``model.cfg.device`` (the venv's
copy of EAP-IG is patched so by scripts/test_references.sh).
"""

from __future__ import annotations

import json
import sys
from functools import partial

import torch


def main(request_path: str) -> None:
    request = json.loads(open(request_path).read())
    import eap.evaluate
    import eap.utils
    import MIB_circuit_track.evaluation as mib_eval
    from eap.attribute import attribute
    from eap.graph import Graph
    from MIB_circuit_track.metrics import logit_diff
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    def tokenize_plus(model, inputs, max_length=None):  # token ids in, as EAP-IG's returns them for unpadded prompts
        tokens = torch.as_tensor(inputs)
        mask = torch.ones_like(tokens)
        return tokens, mask, mask.sum(1), tokens.shape[1]

    for module in (eap.evaluate, eap.utils, sys.modules["eap.attribute"]):
        module.tokenize_plus = tokenize_plus

    m = torch.load(request["model"], weights_only=False)
    cfg = dict(m["cfg"])
    cfg["dtype"] = getattr(torch, cfg["dtype"])
    cfg.update(use_attn_result=True, use_split_qkv_input=True, use_hook_mlp_in=True, device="cpu")
    if cfg.get("n_key_value_heads"):
        cfg["ungroup_grouped_query_attention"] = True
    model = HookedTransformer(HookedTransformerConfig(**cfg))
    missing = model.load_state_dict(m["state"], strict=False).missing_keys
    if [k for k in missing if not k.endswith(("mask", "IGNORE", "rotary_sin", "rotary_cos"))]:
        raise SystemExit(f"missing parameters: {missing}")
    model.eval()

    data = torch.load(request["data"], weights_only=False)
    B = int(request["batch_size"])
    clean, corrupted, labels = data["clean"], data["corrupted"], data["labels"]
    loader = [(clean[i:i + B], corrupted[i:i + B], labels[i:i + B]) for i in range(0, len(clean), B)]
    means_loader = [(corrupted[i:i + B],) for i in range(0, len(corrupted), B)]  # EAP-IG means over batch[0]
    eval_metric = partial(logit_diff, loss=False, mean=False)  # run_evaluation.py's
    out = {}
    for job in request["jobs"]:
        kind, key = job["kind"], job["key"]
        intervention = job.get("intervention", "patching")
        extra = {"intervention_dataloader": means_loader} if "mean" in intervention else {}
        if kind == "attribute":
            graph = Graph.from_model(model)
            attribute(model, graph, loader, partial(logit_diff, loss=True, mean=True), method="EAP", quiet=True)
            graph.to_json(job["out"])
            out[key] = job["out"]
        elif kind == "curve":
            graph = Graph.from_json(job["graph"]) if job["graph"].endswith(".json") else Graph.from_pt(job["graph"])
            counts, area_under, area_from_1, average, faith = mib_eval.evaluate_area_under_curve(
                model, graph, loader, eval_metric, quiet=True, absolute=job["absolute"], intervention=intervention, **extra)
            out[key] = {"weighted_edge_counts": counts, "area_under": area_under, "area_from_1": area_from_1,
                        "faithfulness": faith}
        elif kind == "evaluate":
            graph = Graph.from_json(job["graph"]) if job["graph"].endswith(".json") else Graph.from_pt(job["graph"])
            value = eap.evaluate.evaluate_graph(model, graph, loader, eval_metric, quiet=True, intervention=intervention, **extra)
            out[key] = {"mean": float(value.mean()), "weighted_edge_count": graph.weighted_edge_count()}
        else:
            raise SystemExit(f"unknown job {kind!r}")
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
