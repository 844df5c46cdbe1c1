"""PEAP's position-aware edge scores by its own code (technion-cs-nlp/PEAP, ``src/pos_aware_edge_attribution_patching.py``),
run in a venv of its pins (TransformerLens 2.15.4, torch 2.7.0 ...) by tests/integration/test_references_relp_peap.py.

    python scripts/reference_peap.py PEAP_SRC IN.pt OUT.pt

IN.pt holds a HookedTransformer config (dict), its state dict, per example its clean and counterfactual token ids (BOS
first), its span starts (PEAP's CSV columns, ``length`` last) and its two answer ids. PEAP's function runs as shipped;
what this machine lacks is given to it: ``HookedTransformer.from_pretrained`` returns the model built from IN.pt, a
prompt string is its ids separated by spaces (the model's ``to_tokens``), and PEAP's ``.to("cuda")`` calls stay on the
CPU. Its metric is the logit difference of the answers at the last position. OUT.pt holds every non-crossing edge's
per-span ``sum`` score (PEAP's mean over the examples) keyed by rs_interp's labels: (sender, receiver, span).
"""

from __future__ import annotations

import pickle
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig


def main(peap_src: str, src: str, dst: str) -> None:
    sys.path.insert(0, str(Path(peap_src) / "src"))
    data = torch.load(src)
    to = torch.Tensor.to

    def cpu_to(self, *args, **kwargs):  # PEAP moves every tensor to "cuda": this machine has none
        args = tuple("cpu" if a == "cuda" else a for a in args)
        if kwargs.get("device") == "cuda":
            kwargs["device"] = "cpu"
        return to(self, *args, **kwargs)

    torch.Tensor.to = cpu_to

    def from_pretrained(*args, **kwargs):
        model = HookedTransformer(HookedTransformerConfig(**data["cfg"]))
        model.load_state_dict(data["state"], strict=False)
        model.tokenizer = SimpleNamespace(padding_side="right")  # a prompt string is its ids: no tokenizer is read
        model.to_tokens = lambda text, *a, **k: torch.tensor([[int(x) for x in text.split()]])
        return model.eval()

    HookedTransformer.from_pretrained = staticmethod(from_pretrained)
    import exp as peap_exp  # noqa: E402  (PEAP's modules, from its src/)
    import pos_aware_edge_attribution_patching as peap  # noqa: E402

    spans = list(data["spans"])

    def rows(tokens):
        out = []
        for i, (ids, starts, answers) in enumerate(zip(tokens, data["starts"], data["answers"])):
            row = {"prompt": " ".join(str(int(t)) for t in ids), "a0": int(answers[0]), "a1": int(answers[1])}
            row |= dict(zip(spans, [int(s) for s in starts]))
            out.append(row)
        return pd.DataFrame(out)

    def logit_diff(logits, row, model):
        last = logits[0, -1]
        return last[row["a0"]] - last[row["a1"]]

    class Toy(peap_exp.Experiament):
        def create_datasets(self):
            return rows(data["clean"]), rows(data["counterfactual"])

    exp = Toy(exp_name="toy", model_name="toy", model_path="toy", ablation_type="counterfactual", clean_dataset_path="toy",
              counter_dataset_path="toy", spans=spans, metric=logit_diff, seed=0)
    out_path = Path(tempfile.mkdtemp()) / "peap.pkl"
    peap.position_aware_edge_attribution_patching(exp=exp, dataset_size=len(data["clean"]), save_path=str(out_path))
    with open(out_path, "rb") as f:
        results = pickle.load(f)
    scores = {}
    for edge, score in results.results.items():
        if edge.is_crossing:
            continue
        s = {"r": "embed", "m": f"MLP{edge.upstream_layer_idx}"}.get(edge.upstream_type, f"L{edge.upstream_layer_idx}H{edge.upstream_head_idx}")
        r = {"r": "logits", "m": f"MLP{edge.downstream_layer_idx}"}.get(
            edge.downstream_type, f"L{edge.downstream_layer_idx}H{edge.downstream_head_idx}.{edge.downstream_type}")
        values = score.sum_score
        for u, name in enumerate(spans[:-1]):
            scores[(s, r, name)] = float(values[u])
        scores[(s, r, "length")] = float(values[-1])
    torch.save(scores, dst)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
