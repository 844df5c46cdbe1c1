"""Phi (4.3, float64; its lm_head has a bias, perturbed): DLA's parts sum to the centred target logit,
the b_U part is b_U[t] - mean(b_U) (b_U read from the Hugging Face lm_head), and the logit lens at the last layer
is the model's own softmax."""
import torch, rs_interp as ri
model = ri.load_pretrained("/tmp/red_ckpt/phi", dtype=torch.float64)
toks = torch.randint(0, 299, (2, 7), generator=torch.Generator().manual_seed(4))
hf_bias = None
for n, m in model.named_modules():
    if n.endswith("lm_head") or type(m).__name__ == "Linear" and getattr(m, "out_features", 0) == 300:
        hf_bias = m.bias.detach() if m.bias is not None else None
print("lm_head bias found:", hf_bias is not None, "model.b_U max|.|", float(model.b_U.abs().max()))
with torch.no_grad(): logits = model(toks)
t = ri.next_token_targets(toks); ok = t >= 0
dla = ri.direct_logit_attribution(model, toks, targets=t)
want = (logits - logits.mean(-1, keepdim=True)).gather(-1, t.clamp(min=0)[..., None])[..., 0]
print("DLA sum - centred logit:", float((dla.contributions.sum(0) - want)[ok].abs().max()))
if hf_bias is not None:
    part = dla.contributions[dla.labels.index("b_U")]
    print("b_U part vs hf bias:", float((part - (hf_bias - hf_bias.mean())[t.clamp(min=0)])[ok].abs().max()))
print(dla.labels)
