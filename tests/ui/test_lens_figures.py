"""The lenses' token figure (issue 62): one cell per (reading point, position), coloured by the top token's
probability and written with the token; the Jacobian lens beside the logit lens of the same tokens."""

from __future__ import annotations

import torch

import rs_interp as ri
from rs_interp.ui.plots import jacobian_lens_figure
from tests.builders import make_variant


def test_each_cell_is_the_top_token_and_its_probability():
    model = make_variant("LN", "standard", False, n_layers=3)
    tokens = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    readings = ri.jacobian_lens(model, tokens, ri.fit_jacobian_lens(model, tokens, skip_first=2, progress=False), k=3)
    fig = jacobian_lens_figure(readings, compare=ri.logit_lens(model, tokens, k=3), batch=1, positions=[2, -1],
                               decode=lambda t: f"<{t}>", tokens=["a", "b"])
    ours, logit = fig.data
    assert (ours.name, logit.name) == ("J-lens", "logit lens") and list(ours.x) == ["a", "b"]
    assert list(ours.y) == list(readings.labels)
    assert ours.text[1][1] == f"<{int(readings.top_tokens[1, 1, 7, 0])}>"
    assert abs(ours.z[1][0] - float(readings.top_probs[1, 1, 2, 0])) <= 1e-12
    assert ours.customdata[2][0].count("<") == 3  # every top token kept, in the hover
    assert len(jacobian_lens_figure(readings).data) == 1
