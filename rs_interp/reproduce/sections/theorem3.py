"""Theorem 3's path expansion and the logit lens on the two-layer model."""

from __future__ import annotations

import torch

from ...lens import logit_lens
from ...models import as_dtype
from ...path_expansion import path_expansion, path_logit_attribution
from ...plots import logit_lens_figure, path_contributions_figure, period_sequence
from ..context import Context, Section, banded, exact_row


def paths_section(ctx: Context) -> list[Section]:
    model, batch = ctx.model("induction-2l"), ctx.batch
    m64 = as_dtype(model, torch.float64)
    err = 0.0
    for chunk in batch.tokens.split(100):  # (path, 100, pos, d_vocab) in float64 is ~90 MB; all 1000 would be ~0.9 GB
        pe = path_expansion(m64, chunk)
        with torch.no_grad():
            err = max(err, float((pe.total() - m64(chunk)).abs().max()))
    att = path_logit_attribution(model, batch)
    share = float(att.share_ending_in(model.cfg.n_layers - 1).median())
    seq = period_sequence(11, seed=ctx.seed)
    pos = seq.shape[1] - 2  # the last position with a next token
    one = path_expansion(model, seq, targets=seq.roll(-1, 1))
    fig = path_contributions_figure(one.labels, one.contributions[:, 0, pos].tolist(),
                                    title=f"The correct token's logit at position {pos} (period 11), split into its {len(one.labels)} paths")
    paths = Section("paths", "Theorem 3: the path expansion", (
        exact_row("number of paths", len(pe.labels), 9),
        banded("paths.max_error", "max |path sum - logits| (float64)", err),
        banded("paths.layer1_share", "median share of layer-1-ending paths", share),
        banded("paths.top1_without_last", "direct + layer-0 paths rank correct first", att.top1_without_last_layer),
    ), {"n_paths": len(pe.labels), "max_abs_error": err, "layer1_share_median": share,
        "direct_or_layer0_top1_rate": att.top1_without_last_layer, "labels": list(pe.labels)}, figures=(fig,))
    lens = logit_lens(model, batch.tokens, targets=batch.next_tokens, batch_chunk=250, row_chunk=4096)
    scored = ~lens.target_probs[0].isnan()  # next_tokens is -1 (NaN here) outside the scored positions
    p = [float(lens.target_probs[i][scored].mean()) for i in range(len(lens.labels))]
    names = (("embed", "after the embedding"), ("layer0", "after layer 0"), ("layer1", "after layer 1"))
    lens_rows = tuple(banded(f"logit_lens.{k}", f"P(correct) {n}", v) for (k, n), v in zip(names, p))
    lens_fig = logit_lens_figure(lens.labels, {"P(correct), mean over scored positions": p}, chance=1 / model.cfg.d_vocab,
                                 title="Logit lens on the two-layer model: the answer exists only after layer 1")
    return [paths, Section("logit_lens", "The logit lens on the two-layer model", lens_rows, {"p_correct": p, "labels": list(lens.labels)},
                           figures=(lens_fig,))]
