"""A real model with LayerNorm and MLPs: ``code-2l``, trained here on Python sources, read with the
library's helpers (the issue's claims, the tuned lens, attention sinks, attribution patching)."""

from __future__ import annotations

import torch

from ...heads.composition import composition_scores
from ...heads.head_ablation import ablate_heads, head_ablation_scan
from ...heads.roles import attention_patterns, first_token_attention, prev_token_scores
from ...labels import head_label
from ...metrics import next_token_loss
from ...models.code_model import (
    EOT,
    code_corpus,
    encode_corpus,
    heldout_loss,
    repeated_sequence_losses,
    repeated_tokens,
    unigram_loss,
)
from ...models.data import next_token_targets
from ...readouts.attribution import direct_logit_attribution
from ...readouts.lens import logit_lens
from ...readouts.second_order import second_order_attribution
from ...readouts.tuned_lens import lens_kl, train_tuned_lens
from ...ui.plots import head_scan_figure, logit_lens_figure
from ..context import Context, Row, Section, banded, exact_row
from .ablation import estimate_vs_exact

#: Made-up identifiers (absent from the corpus), each written once and then completed: the prompts
#: "that complete a repeated identifier". The first is drawn in the report.
IDENTIFIERS = ("self.zorblax_gate", "self.quimbrel_scale", "fronzle_weights", "self.blorptic_mask",
               "glimmer_proj", "self.snorkel_bias", "wumbo_state", "self.plonk_norm")
#: Fresh repeated random sequences the repeat rows are measured on.
N_REPEATS = 64


def _prompts(tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """Each identifier's prompt, cut just before the last token of its second occurrence, left-padded
    with the end-of-file token to one length: (tokens, answers)."""
    rows, answers = [], []
    for ident in IDENTIFIERS:
        text = f"    def forward(self, x):\n        h = {ident}(x)\n        return {ident}"
        ids = tokenizer.encode(text).ids
        rows.append(ids[:-1])
        answers.append(ids[-1])
    width = max(map(len, rows))
    eot = tokenizer.token_to_id(EOT)
    return torch.tensor([[eot] * (width - len(r)) + r for r in rows]), torch.tensor(answers)


def code_section(ctx: Context) -> list[Section]:
    """The issue's three claims and the circuit behind them; then the lenses, sinks and attribution patching."""
    model, tokenizer = ctx.code_model()
    cfg = model.cfg
    corpus = code_corpus()
    train_ids, held_ids = encode_corpus(tokenizer, corpus.train), encode_corpus(tokenizer, corpus.heldout)
    held, unigram = heldout_loss(model, held_ids), unigram_loss(train_ids, held_ids, cfg.d_vocab)
    first, repeat = repeated_sequence_losses(model, n=N_REPEATS, seed=ctx.seed + 31)
    half = cfg.n_ctx // 2
    tokens = repeated_tokens(cfg.d_vocab, n=N_REPEATS, half=half, seed=ctx.seed + 32)
    prev, ph, pat_ind, ih, scan, all_layer1, k, k_base = _circuit(ctx, model, tokens, half)
    best_rise = float(scan.effect[1].max())
    rows = [
        banded("code.heldout_loss", f"held-out loss (nats; unigram baseline {unigram:.3f})", held, hi=unigram - 1.0),
        banded("code.repeat_gain",
               f"repeated random sequences: loss on the first occurrence - on the repeat ({first:.2f} - {repeat:.2f})",
               first - repeat),
        banded("code.prev_token", f"largest weight on the previous token, layer 0: head {head_label(0, ph)}",
               float(prev[0, ph])),
        banded("code.induction_weight",
               f"largest weight on the token after the earlier occurrence, layer 1: head {head_label(1, ih)}",
               float(pat_ind[1, ih])),
        banded("code.single_head_ablation",
               "largest loss rise on the repeat, one layer-1 head mean-ablated: head "
               f"{head_label(1, int(scan.effect[1].argmax()))}", best_rise),
        banded("code.layer1_ablation", "loss rise on the repeat, every layer-1 head mean-ablated", all_layer1),
        banded("code.k_composition",
               f"K-composition, prev-token head {head_label(0, ph)} -> induction head {head_label(1, ih)} (random "
               f"baseline {k_base:.3f})",
               float(k[ph, ih]), lo=float(k[[h for h in range(cfg.n_heads) if h != ph], ih].max())),
    ]
    prompt_rows, prompt_results, prompt_figs = _prompt_analysis(model, tokenizer, ih)
    circuit = Section("code", "A real model with LayerNorm and MLPs: code-2l, trained here on Python sources",
                      tuple(rows + prompt_rows),
                      {"heldout_loss": held, "unigram_loss": unigram, "repeat": [first, repeat],
                       "prev_token": prev.tolist(), "induction_weight": pat_ind.tolist(),
                       "ablation_effect": scan.effect.tolist(), "layer1_ablation": all_layer1,
                       "k_composition": k.tolist(), "k_random_baseline": k_base, **prompt_results},
                      figures=(head_scan_figure(scan.effect, title="code-2l: mean ablation of each head, loss rise "
                                                "on the repeat (nats)", colorbar="nats"), *prompt_figs),
                      notes="Both layer-1 heads attend to the earlier occurrence, so ablating one costs less than "
                            "ablating both (they partly stand in for each other). On code the circuit is weak: the "
                            "completion's probability rises from the embedding on, but stays small beside the tokens "
                            "code makes likely there; most of the rise is already there after layer 0 (the lens row), "
                            "and MLP 0 writes more of the completion's logit than any head.")
    return [circuit, _lens_and_sinks(ctx, model, held_ids), _patching(ctx, model, tokens, half)]


def _circuit(ctx: Context, model, tokens: torch.Tensor, half: int) -> tuple:
    """The circuit on the repeat: the previous-token scores and head, the induction weights and head, the mean
    ablation scan, every layer-1 head ablated at once, and the K-composition scores with their random baseline."""
    cfg = model.cfg
    repeat_loss = next_token_loss(_repeat_targets(tokens, half))

    prev = prev_token_scores(model, tokens)
    ph = int(prev[0].argmax())
    pat_ind = _induction_weight(model, tokens, half)  # (layer, head)
    ih = int(pat_ind[1].argmax())
    scan = head_ablation_scan(model, tokens, repeat_loss, ablation="mean", progress=ctx.progress)
    layer1 = [(1, h) for h in range(cfg.n_heads)]
    all_layer1 = float(repeat_loss(ablate_heads(model, tokens, layer1, ablation="mean"))) - scan.clean
    k_result = composition_scores(model, "k", baseline=True)
    k, k_base = k_result.scores[0, :, 1, :], k_result.baseline  # (src head, dst head)
    return prev, ph, pat_ind, ih, scan, all_layer1, k, k_base


def _repeat_targets(tokens: torch.Tensor, half: int) -> torch.Tensor:
    """The next token at every position of the repeat (from ``half``), -1 (skipped) before it."""
    targets = next_token_targets(tokens)
    targets[:, :half] = -1
    return targets


def _induction_weight(model, tokens: torch.Tensor, half: int) -> torch.Tensor:
    """(layer, head) mean attention from each repeat position ``i`` to ``i - half + 1``."""
    pat = attention_patterns(model, tokens)  # layer batch head q k
    return pat.diagonal(offset=-(half - 1), dim1=-2, dim2=-1)[..., 1:].mean(dim=(1, 3))


def _prompt_analysis(model, tokenizer, ih: int) -> tuple[list[Row], dict, tuple]:
    toks, answers = _prompts(tokenizer)
    targets = torch.full_like(toks, -1)
    targets[:, -1] = answers
    lens = logit_lens(model, toks, targets=targets)
    p = lens.target_probs[:, :, -1]  # (point, prompt)
    dla = direct_logit_attribution(model, toks, targets=targets)
    by_comp = dla.contributions[:, :, -1].mean(1)
    heads = [i for i, lab in enumerate(dla.labels) if lab.startswith("L")]
    top = dla.labels[max(heads, key=lambda i: float(by_comp[i]))]
    so = second_order_attribution(model, toks, targets=targets, positions=[-1])
    dst = so.destinations.index(head_label(1, ih))
    src = so.contributions[:, dst, :, 0].mean(1)
    top_src = so.sources[int(src.argmax())]
    labels = list(lens.labels)
    rows = [
        banded("code.prompt_final_p",
               f"{len(IDENTIFIERS)} repeated identifiers: P(completion), the model's output (logit lens: "
               + ", ".join(f"{lab} {float(v):.2g}" for lab, v in zip(labels[:-1], p[:-1].mean(1))) + ")",
               float(p[-1].mean()), lo=10 * float(p[0].mean())),
        exact_row(f"the head with the largest direct logit attribution to the completion, mean over prompts: {top} "
                  f"(MLP 0: {float(by_comp[dla.labels.index('MLP0')]):.2f}, {top}: "
                  f"{float(by_comp[dla.labels.index(top)]):.2f})",
                  top[:2], "L1", theory="-", note="a layer-1 head"),
        Row(f"induction head {head_label(1, ih)}: its largest source (second order)", top_src, "-",
            "W_E or MLP0", top_src in ("W_E", "MLP0"), note="the token it copies"),
    ]
    results = {"prompt_lens": dict(zip(labels, p.mean(1).tolist())),
               "prompt_dla": dict(zip(dla.labels, by_comp.tolist())),
               "second_order_sources": dict(zip(so.sources, src.tolist()))}
    fig = logit_lens_figure(labels, {"P(completion)": p[:, 0].tolist()},
                            title=f"code-2l: logit lens on completing {IDENTIFIERS[0]!r}")
    return rows, results, (fig,)


def _lens_and_sinks(ctx: Context, model, held_ids: torch.Tensor) -> Section:
    width = model.cfg.n_ctx
    n = len(held_ids) // width
    windows = held_ids[: n * width].reshape(n, width)
    train, test = windows[: n // 2], windows[n // 2 :]
    tuned = train_tuned_lens(model, train, steps=300, seed=ctx.seed, progress=ctx.progress)
    kl_logit, kl_tuned = lens_kl(model, test), lens_kl(model, test, tuned)
    ft = first_token_attention(model, test[:64])
    sink = int(ft.mass.argmax())
    sink_head = head_label(*divmod(sink, model.cfg.n_heads))
    rows = [banded("code.tuned_lens_kl", f"KL(final || lens) at {lab}: tuned lens (logit lens {float(a):.3f})",
                   float(b),
                   hi=float(a)) for lab, a, b in zip(tuned.labels, kl_logit, kl_tuned)]
    rows.append(banded("code.sink_mass",
                       f"attention on the first position, head {sink_head}, held-out code (uniform {ft.uniform:.3f})",
                       float(ft.mass.max()), lo=2 * ft.uniform))
    figs = (logit_lens_figure(list(tuned.labels), {"logit lens": kl_logit.tolist(), "tuned lens": kl_tuned.tolist()},
                              title="code-2l: KL(final || lens) by layer, held-out code (nats)"),
            head_scan_figure(ft.mass, title="code-2l: attention on the first position (held-out code)",
                             colorbar="weight",
                             symmetric=False))
    return Section("code_lens", "code-2l: the tuned lens beside the logit lens, and attention sinks", tuple(rows),
                   {"kl_logit_lens": kl_logit.tolist(), "kl_tuned_lens": kl_tuned.tolist(),
                    "first_token_mass": ft.mass.tolist(),
                    "uniform": ft.uniform}, figures=figs,
                   notes="The tuned lens is trained on half of the held-out windows and measured on the other half.")


def _patching(ctx: Context, model, tokens: torch.Tensor, half: int) -> Section:
    """Attribution patching against the exact resample scan, with the toy's two metrics, on the repeat."""
    g = torch.Generator().manual_seed(ctx.seed + 33)
    # no repeat: the induction has nothing to copy
    reference = torch.randint(0, model.cfg.d_vocab, tokens.shape, generator=g)
    targets = tokens[:, half + 1 :]

    def correct_logit(logits: torch.Tensor) -> torch.Tensor:
        x = logits[:, half:-1].float()
        return (x.gather(-1, targets[..., None])[..., 0] - x.mean(-1)).mean()

    loss = next_token_loss(_repeat_targets(tokens, half))

    rows, results, figures = estimate_vs_exact(model, tokens, reference,
                                               {"centered logit": correct_logit, "loss": loss},
                                               title="code-2l: attribution patching vs the exact resample scan, on the "
                                                     "repeat")
    return Section("code_patching", "code-2l: attribution patching against the exact scan", tuple(rows), results,
                   figures=tuple(figures),
                   notes="Reference: random sequences without a repeat, so the patch removes what induction copies. "
                         "Where the first-order estimate fails, and the likely reasons: the previous-token head acts "
                         "mainly through layer 1's attention patterns (a softmax; patching it moves the induction "
                         "heads off the earlier occurrence), which a gradient at the clean run does not see, so its "
                         "estimate is small or of the wrong sign. The induction heads write to the logits, but through "
                         "the final LayerNorm, whose scale their write changes: on the centered logit the estimate has "
                         "their sign and part of their size; on the loss, a log-softmax of logits the patch moves by "
                         "many nats, it can have the wrong sign.")
