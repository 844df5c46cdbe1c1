"""The documentation site: built by scripts/build_docs.sh (offline, --strict) and drawn in headless Chromium.

The build and the browser test are marked ``docs`` (and ``slow``): scripts/test.sh runs them in one
pass only (the 3.x pass, which ends first; see docs/project/testing.md). The checks of the sources
(notebook outputs fresh, every public name in the reference) are fast and run everywhere.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rs_interp
from tests.browser import ALL_DRAWN, DRAWN, offline_page, remote

ROOT = Path(__file__).resolve().parents[2]
HOOKS = ROOT / "docs" / "_hooks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_docs_{name}", HOOKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(HOOKS))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(HOOKS))
    return module


nbs = _load("notebooks")


def _cpu() -> float:
    """CPU seconds of this process and of its finished children (the build, the browser)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _no_example_yet() -> set[str]:
    """docs/_hooks/rs_docs.py's NO_EXAMPLE_YET, read from the source (importing the hook needs mkdocs,
    which only the venv that builds the docs has)."""
    import ast

    tree = ast.parse((HOOKS / "rs_docs.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "NO_EXAMPLE_YET")
    return set(ast.literal_eval(node.value.args[0]))

#: Pages that must draw at least one figure: the home page, every capability page, every tutorial.
CAPABILITIES = sorted(p.stem for p in (ROOT / "docs" / "capabilities").glob("*.md"))
FIGURE_PAGES = (["index.html"] + [f"capabilities/{c}.html" for c in CAPABILITIES]
                + [f"tutorials/{p.stem}.html" for p in nbs.notebooks()])

# --- the sources: fast, every pass -----------------------------------------------------------------

@pytest.mark.parametrize("path", nbs.notebooks(), ids=[p.stem for p in nbs.notebooks()])
def test_notebook_outputs_are_fresh(path):
    """The docs show each notebook's stored outputs: they must come from its code as it is now."""
    nb = nbs.read(path)
    assert nbs.staleness(nb) == [], f"{path.name}: run `{nbs.REFRESH} {path.stem}` and commit the notebook"
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    figures = sum(nbs.PLOTLY_MIME in o.get("data", {}) for c in code for o in c.get("outputs", []))
    assert figures >= 1, f"{path.name} stores no figure"


def test_a_stale_notebook_is_refused():
    """Changing a code cell without re-running it makes the outputs stale, and the build says so."""
    nb = nbs.read(nbs.notebooks()[0])
    nb["cells"] = [dict(c) for c in nb["cells"]]
    first = next(c for c in nb["cells"] if c["cell_type"] == "code")
    first["source"] = "".join(first["source"]) + "\nprint('edited')"
    assert "the code cells changed since their outputs were stored" in nbs.staleness(nb)
    with pytest.raises(ValueError, match="refresh with"):
        nbs.to_markdown(nb, "edited", lambda spec: "")


def test_every_public_name_is_in_the_reference():
    rendered = set()
    for md in (ROOT / "docs" / "reference").glob("*.md"):
        rendered |= set(re.findall(r"^::: rs_interp\.(\w+)", md.read_text(), re.M))
    assert set(rs_interp.__all__) - rendered == set()


def _modules_pointed_to(documented: dict[str, str]) -> dict[str, str]:
    """Every module whose docstring a rendered entry points its reader to (``:mod:`rs_interp.x```, or
    "(module docstring)" in a name of module x), mapped to one entry that points there."""
    import importlib
    import inspect

    out: dict[str, str] = {}
    for entry in documented:
        parent, _, name = entry.rpartition(".")
        obj = getattr(importlib.import_module(parent), name, None)
        if obj is None:
            continue  # the entry is a module itself
        docs = [inspect.getdoc(obj) or ""]
        if inspect.isclass(obj):
            docs += [inspect.getdoc(m) or "" for _, m in inspect.getmembers(obj) if inspect.isfunction(m) or isinstance(m, property)]
        for doc in docs:
            for module in re.findall(r":mod:`~?(rs_interp\.[\w.]+)`", doc):
                out.setdefault(module, entry)
            if "module docstring" in doc and not inspect.ismodule(obj):
                out.setdefault(obj.__module__, entry)
    return out


def test_every_module_a_docstring_points_to_is_in_the_reference():
    """Issue 42 item 4: "(module docstring)" and ``:mod:`` point to definitions (the EAP formula, what a
    circuit ablates): each such module has its own entry in the reference, so its text is on the site."""
    documented: dict[str, str] = {}
    for md in sorted((ROOT / "docs" / "reference").glob("*.md")):
        for entry in re.findall(r"^::: (rs_interp\S*)", md.read_text(), re.M):
            documented.setdefault(entry, md.name)
    pointed = _modules_pointed_to(documented)
    assert len(pointed) >= 20  # the collector finds them (edge attribution, evaluation, the tasks, ...)
    missing = {module: by for module, by in pointed.items() if module not in documented}
    assert missing == {}, f"modules pointed to but not in the reference (module: the entry pointing): {missing}"


def test_every_public_name_has_an_example():
    """The allowlist of names without an example is empty: every public name shows one (the built
    reference is checked below)."""
    assert _no_example_yet() == set()


def test_every_test_file_named_exists():
    """Issue 51 item 4: tests/ mirrors the package (docs/project/testing.md); every test file the docs, the
    README, the scripts, the configuration or a docstring names (``tests/<folder>/test_<module>.py``) is there."""
    sources = [ROOT / "README.md", ROOT / "pyproject.toml", *(ROOT / "scripts").glob("*"), *(ROOT / "docs").rglob("*.md"),
               *(ROOT / "docs").rglob("*.py"), *(ROOT / "docs").rglob("*.css"), *(ROOT / "benchmarks").glob("*.py"),
               *(ROOT / "rs_interp").rglob("*.py"), *(ROOT / "hooks").rglob("*.py"),
               *(p for p in (ROOT / "tests").rglob("*.py") if "data" not in p.relative_to(ROOT / "tests").parts)]
    named = {(src.relative_to(ROOT).as_posix(), m) for src in sources if src.is_file()
             for m in re.findall(r"(?<![\w/.])(tests/[\w/]*\w\.py)\b", src.read_text(errors="replace"))}
    assert len(named) > 40  # the walk sees the references
    missing = sorted(f"{src}: {path}" for src, path in named if not (ROOT / path).is_file())
    assert not missing, f"test files named but not in the tree: {missing}"


# --- the site: built once, in one pass -------------------------------------------------------------

def _wait_for_docs_packages(timeout: float = 900.0) -> None:
    """scripts/test.sh installs the docs packages in the background while this pass runs: wait for
    its exit status (``$RS_INTERP_DOCS_SETUP.rc``), and fail with its log if it failed."""
    prefix = os.environ.get("RS_INTERP_DOCS_SETUP")
    if not prefix:
        return
    rc, log = Path(prefix + ".rc"), Path(prefix + ".log")
    deadline = time.monotonic() + timeout
    while not rc.is_file() or not rc.read_text().strip():
        if time.monotonic() > deadline:
            pytest.fail(f"the docs packages' installation did not finish in {timeout:.0f} s: {log}")
        time.sleep(2)
    text = log.read_text() if log.is_file() else ""
    assert rc.read_text().strip() == "0", f"installing the docs packages failed:\n{text[-3000:]}"


@pytest.mark.slow
@pytest.mark.docs
def test_the_build_uses_the_active_venv(tmp_path):
    """Issue 42: an activated venv with the docs extra builds the site itself; no venv is created."""
    _wait_for_docs_packages()
    fake = tmp_path / "venv" / "bin"
    fake.mkdir(parents=True)
    (fake / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (fake / "python").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    env.update(VIRTUAL_ENV=str(tmp_path / "venv"), RS_INTERP_VENV=str(tmp_path / "never"))
    run = subprocess.run(["bash", str(ROOT / "scripts" / "build_docs.sh"), "--help"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"building with {fake / 'python'} (the active venv)" in run.stderr
    assert not (tmp_path / "never").exists()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    _wait_for_docs_packages()
    out = tmp_path_factory.mktemp("docs")
    # The pytest pass that runs this also runs every docstring example (--doctest-modules): the build
    # runs only those pytest cannot see (attribute docstrings).
    env = dict(os.environ, PYTHON=sys.executable, RS_INTERP_DOCS_DOCTEST="attributes")
    start, cpu = time.perf_counter(), _cpu()
    run = subprocess.run(["bash", str(ROOT / "scripts" / "build_docs.sh"), "--site-dir", str(out / "site")],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    assert run.returncode == 0, f"the docs build failed:\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    print(f"docs build: {elapsed:.1f} s, {_cpu() - cpu:.1f} s of CPU")
    return out


@pytest.mark.slow
@pytest.mark.docs
def test_the_site_is_complete_and_offline(site):
    root = site / "site"
    pages = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.html"))
    for page in FIGURE_PAGES + ["getting-started.html", "reference/index.html", "project/tolerances.html",
                                "project/benchmarks.html", "capabilities/report-sample.html"]:
        assert page in pages, page
    assert (root / "assets" / "javascripts" / "plotly.min.js").stat().st_size > 1_000_000
    for page in pages:
        html = re.sub(r"<script>.*?</script>", "", (root / page).read_text(), flags=re.S)  # inline code: plotly.js's own strings
        # nothing fetched from elsewhere: every script, stylesheet, image and font is the site's own
        external = re.findall(r"""<(?:script|link|img|iframe|source)\b[^>]*?(?:src|href)=["']((?:https?:)?//[^"']+)""", html)
        assert external == [], (page, external[:3])
        assert "fonts.googleapis" not in html and "cdn.plot.ly" not in html, page
    sample = (root / "capabilities" / "report-sample.html").read_text()
    assert sample.count("<script>") == 2 and "src=" not in sample.split("<script>")[0]  # plotly.js inline, nothing fetched
    # every public name has its entry, and (but for the allowlisted ones) an example in it
    reference = "".join((root / "reference" / p).read_text() for p in os.listdir(root / "reference"))
    allowed = _no_example_yet()
    for name in rs_interp.__all__:
        assert f'<h2 id="rs_interp.{name}"' in reference, name
        entry = reference.split(f'<h2 id="rs_interp.{name}"', 1)[1].split('<h2 id="', 1)[0]
        if name not in allowed:
            assert "&gt;&gt;&gt;" in entry, f"rs_interp.{name}'s reference entry shows no example"
    # a docstring's example is fenced once: no literal fence is left in a rendered page
    assert [p for p in pages if "```" in (root / p).read_text()] == []
    # the moved README sections are pages of the site
    text = lambda p: re.sub(r"\s+", " ", (root / p).read_text())  # noqa: E731
    assert "next_token_targets(tokens)" in text("getting-started.html") and "batch.targets" in text("getting-started.html")
    assert "bench:start" in (ROOT / "docs" / "project" / "benchmarks.md").read_text()
    assert "The Transformer Block and the Residual Stream" in text("capabilities/reproduction.html")


#: The pages kept as screenshots beside the built site: the home page, a capability page with figures,
#: the benchmarks table (TransformerLens's columns beside ours) and a reference page.
SCREENSHOTS = ("index.html", "capabilities/composition.html", "project/benchmarks.html", "reference/circuits.html")

#: Measured in the page: every code block, output and table of the text column whose content is wider
#: than its box (it would scroll or be cut), and every space-free identifier in a table cell that the
#: browser broke across lines.
_LAYOUT = """() => {
  const column = document.querySelector('article') || document.body;
  const overflow = [];
  for (const el of column.querySelectorAll('pre, pre > code, .md-typeset__scrollwrap, table')) {
    if (el.closest('.rs-fig')) continue;
    if (el.scrollWidth > el.clientWidth + 1) overflow.push(`${el.tagName} ${el.scrollWidth - el.clientWidth}px: ${el.innerText.slice(0, 50)}`);
  }
  const broken = [...column.querySelectorAll('td code, th code')]
    .filter(c => !/\\s/.test(c.innerText) && c.getClientRects().length > 1).map(c => c.innerText);
  return {overflow, broken};
}"""


@pytest.mark.slow
@pytest.mark.docs
def test_the_site_renders_in_headless_chromium(site):
    """Every page opens from file:// with no error and no network request; every figure draws data;
    at 1280 px nothing overflows its column (:data:`_LAYOUT`); :data:`SCREENSHOTS` are kept beside the built site.
    (The sample report, capabilities/report-sample.html, is rs-interp reproduce's own page, which
    tests/reproduce/test_report.py draws in Chromium: here it is checked to be self-contained only.)"""
    root = site / "site"
    pages = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.html")
                   if p.name not in ("404.html", "report-sample.html"))
    drawn, sizes, overflow, broken = {}, {}, {}, {}
    start, cpu = time.perf_counter(), _cpu()
    with offline_page() as (page, requests, errors):
        for name in pages:
            page.goto((root / name).as_uri())
            page.wait_for_function(ALL_DRAWN.format(selector=".rs-fig"), timeout=60_000)
            drawn[name] = page.evaluate(DRAWN.format(selector=".rs-fig"))
            sizes[name] = page.evaluate("(document.querySelector('article') || document.body).innerText.length")
            layout = page.evaluate(_LAYOUT)
            if layout["overflow"]:
                overflow[name] = layout["overflow"]
            if layout["broken"]:
                broken[name] = layout["broken"]
            if name in SCREENSHOTS:
                page.screenshot(path=str(site / f"{Path(name).stem}.png"), full_page=name in ("index.html", "capabilities/composition.html"))
    print(f"browser: {len(pages)} pages in {time.perf_counter() - start:.1f} s, {_cpu() - cpu:.1f} s of CPU")
    assert remote(requests) == [], "a page made a network request"
    assert errors == [], errors
    assert all(n > 200 for n in sizes.values()), {k: v for k, v in sizes.items() if v <= 200}
    for name in FIGURE_PAGES:
        assert drawn.get(name), f"{name} draws no figure"
    empty = {name: counts for name, counts in drawn.items() if not all(c > 0 for c in counts)}
    assert empty == {}, f"a figure drew no data: {empty}"
    # issue 42: at 1280 px no code block, output or table runs past its column, and no identifier in a
    # table cell is broken across lines
    assert overflow == {}, f"blocks wider than their column (scrollWidth > clientWidth): {overflow}"
    assert broken == {}, f"identifiers broken across lines in table cells: {broken}"
    for name in SCREENSHOTS:
        assert (site / f"{Path(name).stem}.png").stat().st_size > 20_000, name
    print("screenshots: " + ", ".join(str(site / f"{Path(name).stem}.png") for name in SCREENSHOTS))
    (site / "figures.json").write_text(json.dumps(drawn, indent=1))
