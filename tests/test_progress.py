"""Issue 42: progress bars on long work, quiet on short work, and no warning in a Jupyter kernel
without ipywidgets (tqdm is imported only when a bar is asked for, its text bar where no widgets exist)."""

from __future__ import annotations

import importlib.util
import io
import time

import pytest

from rs_interp import _progress


def test_a_bar_waits_before_drawing(monkeypatch):
    """Drawn only once the work has run DELAY seconds: a short loop prints nothing, a long one a bar."""
    monkeypatch.setattr(_progress, "DELAY", 0.2)
    out = io.StringIO()
    tqdm = _progress._tqdm()
    for _ in tqdm(range(3), file=out, delay=_progress.DELAY, desc="short"):
        pass
    assert out.getvalue() == ""
    long = io.StringIO()
    for _ in tqdm(range(3), file=long, delay=_progress.DELAY, desc="long", mininterval=0):
        time.sleep(0.15)
    assert "long" in long.getvalue() and "3/3" in long.getvalue()


@pytest.mark.skipif(importlib.util.find_spec("ipywidgets") is not None, reason="ipywidgets is installed here: the widget bar is used")
def test_a_kernel_without_ipywidgets_imports_rs_interp_quietly():
    """A real Jupyter kernel (nbclient): importing rs_interp and running a helper with its bar on writes
    no warning to the cell's outputs."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import warnings\nwarnings.simplefilter('always')\nimport rs_interp as ri"),
                nbformat.v4.new_code_cell("b = ri.induction_batch(2, seed=0)\n"
                                          "_ = ri.head_ablation_scan(ri.load_toy_model(), b.tokens, ri.next_token_loss(b.targets))")]
    NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "Warning" not in text and "IProgress" not in text, text
