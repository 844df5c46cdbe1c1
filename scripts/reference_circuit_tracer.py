"""Run circuit-tracer itself (its ``attribute``, ``prune_graph``, ``compute_graph_scores``, ``create_graph_files``)
on a model and transcoder files rs_interp wrote.

Runs in circuit-tracer's own venv (scripts/test_circuit_tracer.sh makes it: torch, then circuit-tracer from
its source with its pins, ``transformers<=4.57.3`` and TransformerLens 2.x), never in rs_interp's:
tests/integration/test_references.py calls it as

    $RS_CT_PYTHON scripts/reference_circuit_tracer.py request.json

The request names a model (``{"cfg": HookedTransformerConfig fields, "state": state dict}`` in a .pt), a
transcoder folder in circuit-tracer's format (``config.yaml``, ``layer_{i}.safetensors``: read with its
``load_transcoders``), the vocabulary's token strings and special tokens (a word-level tokenizer is made
from them, offline: circuit-tracer's ``ensure_tokenized`` reads the special ids and ``create_graph_files``
decodes with it), the prompt's ids (no BOS: circuit-tracer prepends it), and runs, each
``{"name", "max_feature_nodes", "batch_size", "update_interval"}``. For each run it writes
``out/{name}.safetensors`` (the graph's tensors, the pruning at 0.8 / 0.98 and the scores) and
``out/{name}/{name}.json`` (``create_graph_files``), and prints one JSON line: what it wrote, and the
tokenizer's text of each token and of the whole prompt.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def _tokenizer(request: dict, folder: Path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    vocab = {s: i for i, s in enumerate(request["vocab"])}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token=request["vocab"][0]))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    special = request["special"]  # {"bos_token": ..., "eos_token": ..., "pad_token": ...}
    PreTrainedTokenizerFast(tokenizer_object=tk, **special).save_pretrained(folder)
    return AutoTokenizer.from_pretrained(str(folder))  # TransformerLens reloads it by its name_or_path


def main(request_path: str) -> None:
    request = json.loads(open(request_path).read())
    import yaml
    from circuit_tracer import attribute
    from circuit_tracer.graph import compute_graph_scores, prune_graph
    from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel
    from circuit_tracer.utils.create_graph_files import create_graph_files
    from circuit_tracer.utils.hf_utils import load_transcoders
    from safetensors.torch import save_file
    from transformer_lens import HookedTransformerConfig

    out = Path(request["out"])
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(request, out / "tokenizer")
    m = torch.load(request["model"], weights_only=False)
    cfg = dict(m["cfg"])
    cfg["dtype"] = getattr(torch, cfg["dtype"])
    cfg.update(device="cpu", tokenizer_name=str(out / "tokenizer"))
    folder = Path(request["transcoders"])
    tc_config = yaml.safe_load((folder / "config.yaml").read_text())
    tc_config["transcoders"] = [str(folder / f"layer_{i}.safetensors") for i in range(cfg["n_layers"])]
    transcoders = load_transcoders(tc_config, device=torch.device("cpu"), dtype=cfg["dtype"], lazy_encoder=False,
                                   lazy_decoder=False)
    model = TransformerLensReplacementModel.from_config(HookedTransformerConfig(**cfg), transcoders, tokenizer=tokenizer)
    # the replacement model wraps each MLP and the unembedding: their parameters move one level down
    state = {}
    for k, v in m["state"].items():
        parts = k.split(".")
        if parts[0] == "blocks" and parts[2] == "mlp":
            k = ".".join(parts[:3] + ["old_mlp"] + parts[3:])
        elif parts[0] == "unembed":
            k = "unembed.old_unembed." + ".".join(parts[1:])
        state[k] = v.to(cfg["dtype"])
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith(("mask", "IGNORE", "rotary_sin", "rotary_cos"))
               and not k.startswith("transcoders.")]
    if missing or result.unexpected_keys:
        raise SystemExit(f"state dict: missing {missing}, unexpected {result.unexpected_keys}")
    model.eval()
    prompt = torch.tensor(request["tokens"])
    report = {"runs": {}, "zero_positions": [model.zero_positions.start, model.zero_positions.stop]}
    for run in request["runs"]:
        name = run["name"]
        graph = attribute(prompt, model, max_feature_nodes=run.get("max_feature_nodes"), batch_size=run["batch_size"],
                          update_interval=run.get("update_interval", 4))
        node_mask, edge_mask, cumulative = prune_graph(graph, 0.8, 0.98)
        replacement, completeness = compute_graph_scores(graph)
        save_file({"adjacency": graph.adjacency_matrix.contiguous(), "active_features": graph.active_features.contiguous(),
                   "selected_features": graph.selected_features.contiguous(),
                   "activation_values": graph.activation_values.contiguous(), "input_tokens": graph.input_tokens.contiguous(),
                   "logit_tokens": graph.logit_token_ids, "logit_probabilities": graph.logit_probabilities.contiguous(),
                   "node_mask": node_mask.contiguous(), "edge_mask": edge_mask.contiguous(), "cumulative": cumulative.contiguous()},
                  str(out / f"{name}.safetensors"))
        create_graph_files(graph, slug=name, output_path=str(out / name), scan=graph.scan)
        report["runs"][name] = {"replacement": replacement, "completeness": completeness, "input_string": graph.input_string}
    report["token_text"] = [tokenizer.decode(i) for i in range(len(request["vocab"]))]
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
