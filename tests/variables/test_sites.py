"""Sites: the hook points an interchange acts on, their widths and the identities each relies on, the views
of a head's output; every other hook point refused; and a change written at ``hook_resid_mid`` reaches the
rest of the model (TransformerLens 4.3's ``hook_resid_mid`` is only the MLP's input: written there alone, a
change never reaches the next block, which the site's write makes up for)."""

from __future__ import annotations

import pytest
import torch

from rs_interp import _backend
from rs_interp.variables import Site
from rs_interp.variables.sites import as_site
from tests.builders import make_variant


def test_kinds_widths_and_identities():
    model = make_variant("LN", "rotary", False, "gqa", n_heads=4)
    cases = [(Site("blocks.0.hook_resid_pre"), "resid", 16, ("stream", "input")),
             (Site("blocks.1.hook_resid_mid"), "resid", 16, ("stream",)),
             (Site("blocks.1.attn.hook_z", 3), "z", 8, ("z",)), (Site("blocks.1.attn.hook_z"), "z", 32, ("z",)),
             (Site("blocks.0.mlp.hook_post"), "neurons", 64, ("mlp weights",))]
    for site, kind, width, identities in cases:
        assert (site.kind, site.check(model).width(model), site.identities) == (kind, width, identities)
    z = torch.arange(2 * 3 * 4 * 8, dtype=torch.float64).reshape(2, 3, 4, 8)
    head = Site("blocks.1.attn.hook_z", 2)
    assert torch.equal(head.view(z), z[:, :, 2]) and torch.equal(head.replace(z, head.view(z)), z)
    assert torch.equal(Site("blocks.1.attn.hook_z").replace(z, z.flatten(2)), z)
    assert as_site(("blocks.1.attn.hook_z", 1), model) == Site("blocks.1.attn.hook_z", 1)


@pytest.mark.parametrize("make, words", [
    (lambda: Site("blocks.0.attn.hook_pattern"), "not a hook point an interchange acts on"),
    (lambda: Site("blocks.0.hook_resid_pre", head=1), "head= is for"),
    (lambda: Site("blocks.0.attn.hook_z", head=0.5), "must be an int"),
])
def test_other_points_are_refused(make, words):
    with pytest.raises(ValueError, match=words):
        make()


def test_a_change_at_resid_mid_reaches_the_next_block():
    """Plain hooks: the change written where ``_backend.stream_writes`` says equals the run from the next block on
    the changed stream plus the MLP's output on it (both versions); on 4.3 the change at ``hook_resid_mid`` alone
    leaves the next block's input as it was."""
    model = make_variant(None, "standard", False)
    toks = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(0))
    delta = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    box = {}

    def record(name):
        return lambda t, hook: box.__setitem__(name, t.detach().clone())

    points = _backend.stream_writes(model, "blocks.0.hook_resid_mid")
    hooks = [(points[0], lambda t, hook: t + delta)] + [(p, lambda t, hook: t + delta) for p in points[1:]]
    model.run_with_hooks(toks, fwd_hooks=hooks + [("blocks.0.hook_mlp_out", record("mlp")),
                                                  ("blocks.1.hook_resid_pre", record("next"))])
    clean = {}
    model.run_with_hooks(toks, fwd_hooks=[("blocks.0.hook_resid_mid", lambda t, hook: clean.__setitem__("mid", t.clone()))])
    assert torch.allclose(box["next"], clean["mid"] + delta + box["mlp"], atol=1e-12)
    alone = {}
    model.run_with_hooks(toks, fwd_hooks=[("blocks.0.hook_resid_mid", lambda t, hook: t + delta),
                                          ("blocks.1.hook_resid_pre", lambda t, hook: alone.__setitem__("next", t.clone()))])
    reaches = torch.allclose(alone["next"] - box["mlp"], clean["mid"] + delta, atol=1e-9)
    assert reaches == (_backend.TL_MAJOR < 4)
