"""Issue 65 item 2: what a helper needs is declared beside it (``@needs(...)`` on its ``def``), and the
certificate's tables (NEEDS, OPTIONAL, ADAPTS, REFUSES) are generated from those declarations; a ``scale.``
wrapper takes its base helper's declaration, not a copy. The decorator changes nothing of the helper (the
function itself is returned), a helper's first call finds its line without reading the whole table, and
``import rs_interp.exact.needs`` stays free of torch."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import textwrap

import pytest

import rs_interp as ri
from rs_interp.exact import needs as N
from rs_interp.exact.needs import ADAPTS, NEEDS, OPTIONAL, REFUSES, needs


def _public(name: str):
    """The public object a NEEDS key names (``"features.attribution_graph"``: rs_interp.features.attribution_graph)."""
    obj = ri
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def test_every_row_is_the_public_helpers_own_declaration():
    assert len(NEEDS) == len(list(NEEDS)) > 60
    for name in NEEDS:
        declared = _public(name).__needs__
        assert declared.name == name and NEEDS[name] == declared.identities
        assert OPTIONAL.get(name, {}) == declared.optional and ADAPTS.get(name, {}) == declared.adapts
        assert REFUSES.get(name, ()) == declared.refuses
    assert set(OPTIONAL) | set(ADAPTS) | set(REFUSES) <= set(NEEDS)
    assert not any(v == {} or v == () for table in (OPTIONAL, ADAPTS, REFUSES) for v in table.values())


def test_the_rows_keep_the_tables_order_and_name_declared_helpers():
    rows = list(NEEDS)
    assert rows[: len(N._ROWS)] == list(N._ROWS)  # a stale name in _ROWS (a helper removed) fails here
    assert rows[len(N._ROWS):] == sorted(rows[len(N._ROWS):])


@pytest.mark.parametrize("name", sorted(n for n in N._ROWS if n.startswith("scale.")))
def test_a_scale_wrapper_takes_its_base_helpers_declaration(name):
    base = name.removeprefix("scale.")
    declared = _public(name).__needs__
    assert declared.like == base
    assert (NEEDS[name], OPTIONAL.get(name), ADAPTS.get(name), REFUSES.get(name)) == (
        NEEDS[base], OPTIONAL.get(base), ADAPTS.get(base), REFUSES.get(base))


def _fake(module: str = "rs_interp.readouts.fake_helper", name: str = "fake_helper"):
    def fake_helper(model, tokens, *, k: int = 3):
        """A helper's docstring."""
        return k

    fake_helper.__module__, fake_helper.__name__, fake_helper.__qualname__ = module, name, name
    return fake_helper


def test_the_decorator_returns_the_helper_itself(monkeypatch):
    monkeypatch.setattr(N, "_DECLARED", dict(N._DECLARED))  # the declarations made here go with the test
    fn = _fake()
    signature, doc = inspect.signature(fn), fn.__doc__
    declared = needs("z", "heads", optional={"scores": "which='q'"}, adapts={"rows": "one pass each"},
                     refuses=("post-norm blocks",))(fn)
    assert declared is fn and inspect.signature(fn) == signature and fn.__doc__ == doc and fn(None, None) == 3
    assert NEEDS["fake_helper"] == ("z", "heads") and ADAPTS["fake_helper"] == {"rows": "one pass each"}
    assert OPTIONAL["fake_helper"] == {"scores": "which='q'"} and REFUSES["fake_helper"] == ("post-norm blocks",)
    assert list(NEEDS)[-1] == "fake_helper"  # a new helper follows the table's rows
    wrapper = needs(like=fn, name="scale.fake_helper")(_fake("rs_interp.scale.fake", "wrapper"))
    assert wrapper.__needs__.identities == ("z", "heads") and REFUSES["scale.fake_helper"] == ("post-norm blocks",)
    assert needs("z")(fn) is fn  # the same function declared again (a module imported twice)


@pytest.mark.parametrize("bad, match", [
    (lambda: needs("no such identity")(_fake()), "no identity or configuration"),
    (lambda: needs("z", refuses=("no such configuration",))(_fake()), "no identity or configuration"),
    (lambda: needs("z", adapts={"no such identity": "..."})(_fake()), "no identity or configuration"),
    (lambda: needs("z", like=ri.copying_scores)(_fake()), "like= takes"),
    (lambda: needs(like=_fake())(_fake()), "like= takes"),
    (lambda: needs("z")(_fake("rs_interp.ui.plots")), "outside rs_interp's"),
    (lambda: needs("z")(_fake("notebook_cell")), "outside rs_interp's"),
    (lambda: needs("z", name="copying_scores")(_fake()), "declared twice"),
])
def test_a_declaration_the_table_could_not_use_is_refused(bad, match, monkeypatch):
    monkeypatch.setattr(N, "_DECLARED", dict(N._DECLARED))
    with pytest.raises(ValueError, match=match):
        bad()


def test_an_unknown_helper_is_not_in_the_tables():
    assert "no_such_helper" not in NEEDS and ADAPTS.get("no_such_helper", {}) == {}
    with pytest.raises(KeyError):
        NEEDS["no_such_helper"]


def test_a_declared_helper_is_read_without_the_whole_table(monkeypatch):
    """``require(model, helper)`` on a helper's first call: its module is imported, so its line is read as it is,
    without importing every helper's module (what iterating the table does)."""
    def refuse():
        raise AssertionError("the whole table was loaded")

    monkeypatch.setattr(N, "_load_all", refuse)
    assert NEEDS["copying_scores"] == ("heads", "values") and ADAPTS.get("copying_scores", {}) == {}
    with pytest.raises(AssertionError, match="whole table"):
        list(NEEDS)


def test_the_module_imports_no_torch():
    code = "import sys; import rs_interp.exact.needs; assert 'torch' not in sys.modules, sorted(sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow
def test_a_first_call_reads_its_own_line_in_a_fresh_interpreter():
    """In a fresh interpreter: a helper's module declares its line when it is imported (``require`` finds it
    without importing every helper's module); iterating the table imports them all."""
    code = textwrap.dedent("""
        import sys
        from rs_interp.exact import needs as N
        import rs_interp.heads.copying
        assert N.NEEDS["copying_scores"] == ("heads", "values") and not N._LOADED
        assert "rs_interp.features.attribution" not in sys.modules
        assert "features.attribution_graph" in N.NEEDS and N._LOADED == [True]
        assert "rs_interp.features.attribution" in sys.modules
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_jacobian_lens_fit_reads_the_identities_it_declares():
    backward = importlib.import_module("rs_interp.readouts.jacobian_backward")
    assert backward.IDENTITIES == tuple(ADAPTS["fit_jacobian_lens"])
