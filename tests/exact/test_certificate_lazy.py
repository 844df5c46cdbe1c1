"""Issue 64: the certificate measured as far as it is read. ``require(model, helper)`` measures the identities the
helper needs (and, where it reads them, those it adapts to) that are not yet cached under the model's key, each
measurement once; a later helper measures only the rest; ``certify`` measures all. Each identity measured this way
is the one the whole certificate measures (the same verdict and gap, on working and broken models), and the run
from a layer costs one block per layer, not one run per layer."""

from __future__ import annotations

import pytest
import torch

import rs_interp as ri
from rs_interp.exact import _runs
from rs_interp.exact.certificate import ADAPTS, IDENTITIES, NEEDS, require
from tests.builders import make_variant
from tests.mutations import MUTATIONS

METRIC = lambda lg: lg[:, -1, 0].mean()  # noqa: E731


def _model(n_layers=2):
    return make_variant("LN", "standard", False, n_layers=n_layers, act_fn="relu")


def _tokens(seed=0):
    return torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(seed))


def _counting(monkeypatch, name):
    calls = []
    real = getattr(_runs, name)

    def counted(*args, **kwargs):
        calls.append(name)
        return real(*args, **kwargs)

    monkeypatch.setattr(_runs, name, counted)
    return calls


def test_every_identity_is_yielded_by_one_measurement():
    """A new identity needs a line in MEASUREMENTS (and its check); a new helper needs its NEEDS line only."""
    yielded = [n for names in _runs.MEASUREMENTS.values() for n in names]
    assert sorted(yielded) == sorted(set(IDENTITIES) - {"source"})


@pytest.mark.parametrize("helper", ["composition_scores", "attribution_patching", "logit_lens", "ablate_heads"])
def test_require_measures_what_the_helper_reads_and_no_more(helper):
    model = _model()
    cert = require(model, helper, adapts=helper != "attribution_patching")
    reads = set(NEEDS[helper]) | (set(ADAPTS.get(helper, {})) if helper != "attribution_patching" else set())
    measurements = {m for m, names in _runs.MEASUREMENTS.items() if reads & set(names)}
    free = {n for m in measurements if m != "clean run" for n in _runs.MEASUREMENTS[m]}  # a run's other identities
    assert reads <= set(cert.measured()) <= reads | free | {"source"}
    with pytest.raises(KeyError, match="not measured"):
        cert.holds(next(n for n in IDENTITIES if n not in cert.measured()))
    assert "not measured" in cert.table()


def test_a_later_helper_measures_only_the_rest(monkeypatch):
    model = _model()
    rows, gradient, moved = (_counting(monkeypatch, n) for n in ("_rows", "_gradient_run", "_moved_run"))
    first = require(model, "path_patching")  # stream, z, heads, readers; adapts: rows, start at layer
    assert (len(rows), len(gradient), len(moved)) == (1, 1, 1)
    again = require(model, "edge_attribution_patching", adapts=False)  # adds input, projections, gradients
    assert (len(rows), len(gradient), len(moved)) == (1, 1, 1)
    assert all(again[i.name] is i for i in first.identities)  # the cached verdicts, not measured again
    assert require(model, "ablate_heads") is again  # nothing new: the cached certificate itself
    full = ri.certify(model)
    assert full.measured() == tuple(IDENTITIES) and ri.certify(model) is full and len(rows) == 1


def test_the_qk_fix_reads_what_plain_attribution_patching_does_not():
    model = _model()
    tokens, reference = _tokens(0), _tokens(1)
    ri.attribution_patching(model, tokens, METRIC, reference=reference)
    assert "rows" not in require(model, "ablate_heads").measured()
    ri.attribution_patching(model, tokens, METRIC, reference=reference, which="k", qk_fix=True)
    assert {"rows", "scores", "start at layer"} <= set(require(model, "ablate_heads").measured())


#: Helpers whose requires, in this order, split every measurement over several calls.
_ORDER = ["composition_scores", "attribution_patching", "logit_lens", "path_patching"]


@pytest.mark.parametrize("mutation", [None, "heads", "z", "readers", "rows", "start at layer", "mlp weights"])
def test_an_identity_measured_piecewise_is_the_whole_certificates(mutation):
    model = _model()
    if mutation is not None:
        MUTATIONS[mutation](model)
    for helper in _ORDER:
        try:
            require(model, helper)
        except ValueError:
            pass  # a refusal: what it measured is cached all the same
    piecewise = {i.name: i for i in ri.certify(model).identities}
    whole = {i.name: i for i in ri.certify(model, refresh=True).identities}
    assert {n: (i.holds, i.why) for n, i in piecewise.items()} == {n: (i.holds, i.why) for n, i in whole.items()}
    for name, identity in whole.items():
        assert identity.gap == pytest.approx(piecewise[name].gap, rel=1e-6, nan_ok=True), name


def test_the_run_from_a_layer_runs_each_block_once():
    """The clean run and ``start at layer`` together run each block twice (before: once, then once per run from
    every later layer too: L (L + 1) / 2 more), and the run to the logits happens once, from the last layer."""
    model = _model(n_layers=4)
    calls = []
    for block in model.blocks:
        block.register_forward_pre_hook(lambda mod, args, kwargs: calls.append(mod), with_kwargs=True)
    require(model, "ablate_heads")  # the clean run and the z runs: cached, and counted out below
    calls.clear()
    from rs_interp._state import preserve_state
    from rs_interp.exact.stream import mlp_flags

    with preserve_state(model, **mlp_flags(model)):
        measured = _runs.measure(model, 1e-10, ("start at layer",))
    assert measured["start at layer"].holds and len(calls) == 2 * model.cfg.n_layers
