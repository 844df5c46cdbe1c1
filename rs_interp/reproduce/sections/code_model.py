"""code-2l: the GPT-2-architecture toy trained on Python sources, read with every helper."""

from __future__ import annotations

import torch
from transformer_lens import HookedTransformer

from ...composition import composition_scores
from ...code_model import load_code_tokenizer, repeated_sequence_losses
from ...data import InductionBatch
from ...head_ablation import head_ablation_scan
from ...heads import induction_scores, prev_token_scores
from ...lens import logit_lens
from ...models import read_metadata, toy_model_path
from ...attribution import direct_logit_attribution
from ...second_order import second_order_attribution
from ...plots import head_scan_figure, logit_lens_figure, loss_curve_figure, second_order_figure
from ..context import Context, Row, Section, banded, exact_row


#: The code prompt of the code-2l section: a made-up identifier, defined once, to be completed.
CODE_PROMPT = "        zorblat_scale = self.zorblat_bias + 1\n        return x * zorblat_"
CODE_ANSWER = "scale"


def _repeat_batch(model: HookedTransformer, n: int, half: int, seed: int) -> InductionBatch:
    """Random token sequences repeated once, as an InductionBatch (period ``half``; the repeat is scored)."""
    seq = torch.randint(0, model.cfg.d_vocab, (n, half), generator=torch.Generator().manual_seed(seed))
    tokens = torch.cat([seq, seq], 1)
    scored = (torch.arange(2 * half - 1) >= half)[None].expand(n, -1).clone()
    return InductionBatch(tokens=tokens, periods=torch.full((n,), half), scored=scored)


def code_model_section(ctx: Context) -> Section:
    """The GPT-2-architecture toy trained on Python sources: a real model with LayerNorm and MLPs."""
    model, meta = ctx.model("code-2l"), read_metadata(toy_model_path("code-2l"))
    tok = load_code_tokenizer()
    first, repeat = repeated_sequence_losses(model, n=64, half=50, seed=ctx.seed + 1)
    rb = _repeat_batch(model, 64, 50, ctx.seed + 2)
    prev = prev_token_scores(model, rb.tokens)
    ind = induction_scores(model, rb)
    ph = int(prev[0].argmax())
    ih = int(ind.target[1].argmax())

    def repeat_loss(logits: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits[:, :-1][rb.scored].float(), rb.tokens[:, 1:][rb.scored])

    scan = head_ablation_scan(model, rb.tokens, repeat_loss, method="mean")
    k = composition_scores(model, "K")[0, ph, 1]
    qv = float(torch.maximum(composition_scores(model, "Q")[0, ph, 1], composition_scores(model, "V")[0, ph, 1]).max())
    ids = torch.tensor(tok.encode(CODE_PROMPT).ids)[None]
    answer = tok.encode(CODE_ANSWER).ids[0]
    targets = torch.full_like(ids, answer)
    lens = logit_lens(model, ids, targets=targets)
    top = tok.decode([int(lens.top_tokens[-1, 0, -1, 0])])
    dla = direct_logit_attribution(model, ids, targets=targets)
    so = second_order_attribution(model, ids, targets=targets, positions=[-1])
    head_dla = {lab: float(dla.contributions[i, 0, -1]) for i, lab in enumerate(dla.labels) if lab.startswith("L")}
    best_head = max(head_dla, key=head_dla.get)
    m = so.matrix(0, 0)
    j = so.destinations.index(best_head)
    best_src = so.sources[int(m[:, j].argmax())]
    rows = [
        banded("code_model.heldout_loss", "held-out loss (nats), band: the unigram baseline - 1", meta["heldout_loss"], hi=meta["unigram_loss"] - 1.0),
        banded("code_model.unigram_loss", "unigram baseline on the held-out split (nats)", meta["unigram_loss"]),
        banded("code_model.first_occurrence", "repeated random tokens: loss on the first occurrence", first),
        banded("code_model.repeat", "repeated random tokens: loss on the repeat", repeat),
        banded("code_model.repeat_drop", "loss falls on the repeat by (nats)", first - repeat),
        banded("code_model.prev_token_weight", f"prev-token head (0,{ph}): weight on i-1", float(prev[0, ph])),
        banded("code_model.induction_target", f"induction head (1,{ih}): weight on i-p+1", float(ind.target[1, ih])),
        banded("code_model.ablation_rise", "largest rise of the repeat loss, one layer-1 head mean-ablated", float(scan.effect[1].max())),
        exact_row("that head is the induction head", f"L1H{int(scan.effect[1].argmax())}", f"L1H{ih}"),
        banded("code_model.k_composition", f"K-composition (0,{ph}) -> (1,{ih}), band: above its Q and V scores", float(k[ih]), lo=qv),
        banded("code_model.prompt_p", f"code prompt: P({CODE_ANSWER!r}) at the last reading point", float(lens.target_probs[-1, 0, -1])),
        exact_row("code prompt: top prediction", repr(top), repr(CODE_ANSWER)),
        Row("code prompt: head with the largest direct part, and what it read most", f"{best_head} <- {best_src}", "-", "report", None),
    ]
    results = {"training": meta["training"], "corpus": meta["corpus"], "heldout_loss": meta["heldout_loss"],
               "unigram_loss": meta["unigram_loss"], "repeat": {"first": first, "repeat": repeat},
               "prev_token": prev.tolist(), "induction_target": ind.target.tolist(), "ablation_effect": scan.effect.tolist(),
               "prompt": {"text": CODE_PROMPT, "answer": CODE_ANSWER, "lens_p": lens.target_probs[:, 0, -1].tolist(),
                          "head_dla": head_dla, "second_order_top_source": best_src}}
    figures = (loss_curve_figure(meta["loss_curve"], every=50, baseline=meta["unigram_loss"], title="code-2l: training loss"),
               head_scan_figure(scan.effect, title="code-2l: mean ablation, rise of the loss on the repeat (nats)", colorbar="nats"),
               logit_lens_figure(lens.labels, {f"P({CODE_ANSWER!r})": lens.target_probs[:, 0, -1].tolist()},
                                 title="code-2l: logit lens on the code prompt"),
               second_order_figure(so.sources, so.destinations, m, title="code-2l: code prompt, last position: source -> head"))
    notes = (f"Corpus: torch {meta['corpus']['torch']} sources ({', '.join(meta['corpus']['folders'])}), sha256 "
             f"{meta['corpus']['sha256'][:16]}..., {meta['corpus']['tokens'][0]:,} training and {meta['corpus']['tokens'][1]:,} "
             f"held-out tokens. Prompt: {CODE_PROMPT!r}.")
    return Section("code_model", "A real model with LayerNorm and MLPs: code-2l, trained here on Python sources", tuple(rows), results,
                   figures=figures, notes=notes)
