"""GPT-2 small: the exact parameter count, the conversion check, and (with real weights) Paris."""

from __future__ import annotations

from typing import Any

from ...models.gpt2 import find_pretrained_gpt2
from ...models.gpt2_sizes import count_parameters, gpt2_config
from ...ui.plots import logit_lens_figure, parameter_breakdown_figure
from ..context import Context, Row, Section, banded
from ..expected import GPT2_SMALL_PARAMETERS
from ..gpt2_check import analyse_gpt2, conversion_check


def gpt2_section(ctx: Context) -> Section:
    """GPT-2 small: the exact parameter count, the offline conversion check, and (with real weights) Paris."""
    pc = count_parameters(gpt2_config("small"))
    expected = GPT2_SMALL_PARAMETERS
    rows = [Row(f"parameters: {k}", v, f"{expected[k]:,}", "exact", v == expected[k]) for k,
            v in pc.by_category.items()]
    rows.append(Row("parameters: total", pc.total, f"{expected['total']:,}", "exact", pc.total == expected["total"]))
    for h in (6, 24):  # heads split a fixed budget: d_head = d_model / n_heads, the total does not move
        total = count_parameters(gpt2_config("small", n_heads=h)).total
        rows.append(Row(f"parameters with n_heads = {h} (d_head {768 // h}): total", total, f"{expected['total']:,}",
                        "exact",
                        total == expected["total"]))
    d = gpt2_config("small").d_model
    # biases: b_Q,K,V,O; b_in (4d), b_out
    weights = {k: pc.per_layer[k] - b for k, b in (("attention", 4 * d), ("mlp", 5 * d))}
    rows.append(banded("gpt2.mlp_to_attention", "MLP : attention weights per block (before biases)",
                       weights["mlp"] / weights["attention"]))
    ctx.log("GPT-2: converting a random-weight Hugging Face checkpoint")
    diff = conversion_check(seed=ctx.seed)
    rows.append(banded("gpt2.conversion", "conversion: max |centered logit diff| vs Hugging Face", diff))
    ctx.log("GPT-2: looking for pretrained weights")
    model, why = find_pretrained_gpt2()
    results: dict[str, Any] = {"parameters": dict(pc.by_category, total=pc.total, per_layer=pc.per_layer,
                                                  unembed_bias_not_in_checkpoint=pc.unembed_bias),
                               "conversion_max_abs_diff": diff,
                               "weights": "pretrained" if model is not None else "random",
                               "weights_note": why}
    if model is not None:
        a = analyse_gpt2(model, weights="pretrained", source=why, seed=ctx.seed)
        rows.append(Row("top prediction for 'The Eiffel Tower is in the city of'", repr(a.final_top_token), "' Paris'",
                        "= ' Paris'", a.final_top_token == " Paris"))
        results |= {"lens_p_paris": dict(zip(a.lens_labels, a.lens_p_answer)), "top_induction": list(a.top_induction),
                    "top_prev_token": list(a.top_prev_token)}
    notes = f"Weights: {results['weights']} ({why})"
    figures = [parameter_breakdown_figure(pc.by_category)]
    if model is not None:
        figures.append(logit_lens_figure(a.lens_labels, {"P(' Paris')": a.lens_p_answer},
                                         title="GPT-2 small: logit lens on 'The Eiffel Tower is in the city of'"))
    return Section("gpt2", "GPT-2 small: parameters, conversion, weights", tuple(rows), results, figures=tuple(figures),
                   notes=notes)
