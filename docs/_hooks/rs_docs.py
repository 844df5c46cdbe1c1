"""MkDocs hooks of rs_interp's site (``hooks:`` in mkdocs.yml). Each failure here fails the build.

- **Executed examples.** A fence opened with ```` ```python exec ```` runs when the page builds, like a
  notebook cell (the blocks of one page share one namespace): the page shows the code, what it
  printed, and, when its last line is an expression, its value; a plotly figure is drawn. An
  exception stops the build, naming the page and the block. ``site_file(path)`` gives an example a
  file to write that the site then holds (the reproduction page's sample report).
- **Figures, offline.** Figures are drawn with plotly.js served by the site itself
  (``assets/javascripts/plotly.min.js``, from the installed ``plotly``), loaded only by pages that
  draw one; no page requests anything from the network.
- **Tutorials.** ``notebooks/*.ipynb`` become ``tutorials/<name>.html`` from their stored outputs
  (``docs/_hooks/notebooks.py``; stale outputs stop the build).
- **The reference is complete.** Every name of ``rs_interp.__all__`` must be rendered by a
  ``::: rs_interp.NAME`` line of ``docs/reference/`` and have a docstring with an example
  (``>>>``), except the names of :data:`NO_EXAMPLE_YET`; each example runs (doctest, in the
  module's namespace) unless ``RS_INTERP_DOCS_DOCTEST`` says otherwise (see :func:`_doctests`).
- **Generated, never copied**: the reproduction page's bands table (``{{ bands_table }}``, from
  ``rs_interp.reproduce.expected``), the reference's index of every public name (``{{ api_index }}``),
  the certificate's identities and the tolerances by dtype and source (``{{ certificate_table }}``,
  ``{{ tolerance_table }}``, from ``rs_interp.exact.certificate`` and the loader).
"""

from __future__ import annotations

import ast
import contextlib
import doctest
import html
import io
import json
import logging
import os
import re
import sys
import time
import traceback
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

sys.path.insert(0, str(Path(__file__).parent))
import notebooks as nbs  # noqa: E402

log = logging.getLogger("mkdocs.hooks.rs_docs")
ROOT = Path(__file__).resolve().parents[2]
PLOTLY_JS = "assets/javascripts/plotly.min.js"

#: Public names whose docstring has no example yet, and why they may build without one (none now:
#: a name goes here only while a change that owns its module is in flight, and leaves it with the example).
NO_EXAMPLE_YET = frozenset({})

_staged: dict[str, Path] = {}  # site path -> file an example wrote (site_file), copied after the build
_api: dict[str, tuple[str, str]] = {}  # public name -> (its reference page, the first line of its docstring)
_EXEC = re.compile(r"^```python exec[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
_timings: dict[str, float] = {}
_blocks: dict[str, float] = {}


# --------------------------------------------------------------------------------------------- figures
def figure_html(spec: dict, fig_id: str) -> str:
    """A div and the script that draws ``spec`` (a plotly figure's JSON) into it with the local plotly.js."""
    payload = json.dumps({"data": spec.get("data", []), "layout": spec.get("layout", {})}).replace("</", "<\\/")
    return (f'<div class="rs-fig" id="{fig_id}"></div>\n<script>(function(s){{Plotly.newPlot({json.dumps(fig_id)}, '
            f's.data, s.layout, {{responsive: true, displaylogo: false}});}})({payload});</script>')


class _Figures:
    """Figures of one page: placeholders in the Markdown, the HTML put back after conversion."""

    def __init__(self, page_id: str):
        self.page_id, self.html = page_id, []

    def add(self, spec: dict) -> str:
        n = len(self.html)
        self.html.append(figure_html(spec, f"fig-{self.page_id}-{n}"))
        return f'\n<div class="rs-fig-placeholder" data-n="{n}"></div>\n'


_pages: dict[str, _Figures] = {}


def _page_id(page) -> str:
    return re.sub(r"[^a-z0-9]+", "-", page.file.src_uri.lower().removesuffix(".md")).strip("-")


# ---------------------------------------------------------------------------------- executed examples
def _run_block(code: str, ns: dict, where: str) -> tuple[str, object]:
    """Run ``code`` in ``ns``; return what it printed and the value of a final expression (or None)."""
    tree = ast.parse(code, filename=where)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(tree, where, "exec"), ns)
        value = eval(compile(ast.Expression(last.value), where, "eval"), ns) if last is not None else None
    return out.getvalue(), value


def site_file(path: str) -> Path:
    """For an example: a file to write that the site will hold at ``path`` (relative to the site's
    root), e.g. a report the page links to with a raw ``<a href>``."""
    import tempfile

    staged = Path(tempfile.mkdtemp(prefix="rs_docs_")) / Path(path).name
    _staged[path] = staged
    return staged


def _executed(markdown: str, page, figures: _Figures) -> str:
    ns: dict = {"__name__": f"docs.{figures.page_id}", "site_file": site_file}
    src = page.file.src_uri
    start = time.perf_counter()

    def run(match: re.Match) -> str:
        code = match.group(1)
        line = markdown[: match.start()].count("\n") + 2
        where = f"docs/{src}:{line}"
        t0 = time.perf_counter()
        try:
            printed, value = _run_block(code, ns, where)
        except Exception as e:  # the page's example failed: the build fails, saying where and why
            raise PluginError(f"the example at {where} failed:\n{''.join(traceback.format_exception(e))}") from e
        _blocks[where] = time.perf_counter() - t0
        parts = [f"```python\n{code.rstrip()}\n```"]
        if printed.strip():
            parts.append(nbs._fence(printed))
        if value is not None:
            if type(value).__module__.startswith("plotly"):
                parts.append(figures.add(json.loads(value.to_json())))
            else:
                parts.append(nbs._fence(repr(value)))
        return "\n\n".join(parts) + "\n"

    out = _EXEC.sub(run, markdown)
    if out is not markdown and out != markdown:
        _timings[src] = time.perf_counter() - start
    return out


# ------------------------------------------------------------------------------------- generated text
def _macros(markdown: str) -> str:
    """``{{ bands_table }}``: every banded quantity of the reproduction, from
    ``rs_interp.reproduce.expected`` (one line each there; never copied into a page).
    ``{{ api_index }}``: every public name, its page of the reference and its summary line."""
    if "{{ api_index }}" in markdown:
        import rs_interp

        rows = ["| name | what | page |", "|---|---|---|"]
        for name in rs_interp.__all__:
            page, summary = _api[name]
            rows.append(f"| [`{name}`][rs_interp.{name}] | {summary} | [{page.removesuffix('.md')}]({page}) |")
        markdown = markdown.replace("{{ api_index }}", "\n".join(rows))
    if "{{ bands_table }}" in markdown:
        from rs_interp.reproduce.expected import EXPECTED, UNBANDED

        rows = ["| quantity | theory | band |", "|---|---|---|"]
        for key, e in EXPECTED.items():
            band = "—" if e.band == UNBANDED else html.escape(e.band)
            rows.append(f"| `{key}` | {html.escape(e.theory).replace('|', '&#124;')} | {band} |")
        markdown = markdown.replace("{{ bands_table }}", "\n".join(rows))
    if "{{ certificate_table }}" in markdown:
        from rs_interp.exact.certificate import IDENTITIES, NEEDS, REMEDIES

        rows = ["| identity | what holds | helpers that need it | where it fails |", "|---|---|---|---|"]
        for name, statement in IDENTITIES.items():
            users = sum(name in needs for needs in NEEDS.values())
            rows.append(f"| `{name}` | {html.escape(statement)} | {users} | {html.escape(REMEDIES.get(name, ''))} |")
        markdown = markdown.replace("{{ certificate_table }}", "\n".join(rows))
    if "{{ helper_table }}" in markdown:
        from rs_interp.exact.certificate import ADAPTS, EXEMPT, IDENTITIES, NEEDS, OPTIONAL, REFUSES

        names = list(IDENTITIES)
        # numbered columns (the names in the legend and on hover): twenty names side by side overflow the column
        legend = "Columns: " + "; ".join(f"{i} `{n}`" for i, n in enumerate(names, 1)) + "."
        rows = [legend, "", "| helper | " + " | ".join(f'<span title="{n}">{i}</span>' for i, n in enumerate(names, 1))
                + " | refuses |", "|---|" + "---|" * (len(names) + 1)]
        for helper, needs in NEEDS.items():
            cells = ["✔" if n in needs else "o" if n in OPTIONAL.get(helper, {}) else "a" if n in ADAPTS.get(helper, {})
                     else "" for n in names]
            rows.append(f"| `{helper}` | " + " | ".join(cells) + f" | {', '.join(REFUSES.get(helper, ())) or '—'} |")
        rows += ["", "| exempt | why |", "|---|---|"] + [f"| `{h}` | {html.escape(why)} |" for h, why in EXEMPT.items()]
        markdown = markdown.replace("{{ helper_table }}", "\n".join(rows))
    if "{{ tolerance_table }}" in markdown:
        from rs_interp.exact.certificate import TOLERANCES
        from rs_interp.models._source import SOURCE_TOLERANCE

        rows = ["| dtype | identities, native modules | identities, Hugging Face modules (4.x) | a loaded model against its checkpoint |",
                "|---|---|---|---|"]
        for dtype, source_tol in SOURCE_TOLERANCE.items():
            name = str(dtype).removeprefix("torch.")
            rows.append(f"| {name} | {TOLERANCES[(dtype, 'native')]:g} | {TOLERANCES[(dtype, 'booted')]:g} | {source_tol:g} |")
        markdown = markdown.replace("{{ tolerance_table }}", "\n".join(rows))
    return markdown


# ----------------------------------------------------------------------------------------- the hooks
def on_files(files: Files, config) -> Files:
    from plotly.offline import get_plotlyjs

    files.append(File.generated(config, PLOTLY_JS, content=get_plotlyjs()))
    for path in nbs.notebooks():
        nb = nbs.read(path)
        try:
            body = nbs.to_markdown(nb, path.stem, lambda spec: f"<!--rs-nbfig {json.dumps(spec)} -->")
        except ValueError as e:
            raise PluginError(str(e)) from e
        files.append(File.generated(config, f"tutorials/{path.stem}.md", content=body))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    figures = _pages[page.file.src_uri] = _Figures(_page_id(page))
    # notebook figures (stored JSON) -> placeholders
    markdown = re.sub(r"<!--rs-nbfig (.*?) -->", lambda m: figures.add(json.loads(m.group(1))), markdown, flags=re.S)
    markdown = _macros(markdown)
    return _executed(markdown, page, figures)


def on_page_content(content: str, page, config, files) -> str:
    figures = _pages.pop(page.file.src_uri, None)
    if not figures or not figures.html:
        return content
    content, n = re.subn(r'<div class="rs-fig-placeholder" data-n="(\d+)"></div>',
                         lambda m: figures.html[int(m.group(1))], content)
    if n != len(figures.html):
        raise PluginError(f"{page.file.src_uri}: {len(figures.html)} figures but {n} placeholders survived Markdown")
    from mkdocs.utils import get_relative_url

    src = get_relative_url(PLOTLY_JS, page.url or "index.html")
    return f'<script src="{src}"></script>\n' + content


def on_pre_build(config) -> None:
    _check_reference(config)


def on_post_build(config) -> None:
    import shutil

    for rel, staged in _staged.items():
        if not staged.is_file():
            raise PluginError(f"an example promised {rel} (site_file) but wrote nothing")
        target = Path(config["site_dir"]) / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staged), target)
        shutil.rmtree(staged.parent, ignore_errors=True)
    if _timings:
        slow = ", ".join(f"{k} {v:.1f} s" for k, v in sorted(_timings.items(), key=lambda kv: -kv[1])[:5])
        log.info(f"executed examples: {sum(_timings.values()):.1f} s in all ({slow})")
        log.debug("slowest example blocks: " + ", ".join(f"{k} {v:.2f} s" for k, v in sorted(_blocks.items(), key=lambda kv: -kv[1])[:8]))


# --------------------------------------------------------------------------- the reference's contract
def _check_reference(config) -> None:
    """Every public name rendered by the reference, with a docstring holding an example that runs."""
    start = time.perf_counter()
    import griffe

    import rs_interp

    log.info(f"imported rs_interp in {time.perf_counter() - start:.1f} s")
    docs = Path(config["docs_dir"])
    rendered = {}
    for md in sorted((docs / "reference").glob("*.md")):
        for path in re.findall(r"^::: (rs_interp\.[\w.]+)", md.read_text(), re.M):
            rendered.setdefault(path, md.name)
    pkg = griffe.load("rs_interp", search_paths=[str(ROOT)], resolve_aliases=True, resolve_external=False)
    hooks_pkg = griffe.load("hooks", search_paths=[str(ROOT)])
    problems, examples = [], []
    for name in rs_interp.__all__:
        if f"rs_interp.{name}" not in rendered:
            problems.append(f"rs_interp.{name} is public but no `::: rs_interp.{name}` in docs/reference/")
        obj = hooks_pkg if name == "hooks" else pkg[name]
        text = obj.docstring.value if obj.docstring else ""
        summary = text.strip().split("\n\n")[0].replace("\n", " ").replace("|", "&#124;")
        summary = re.sub(r":\w+:`~?([\w.]+)`", lambda m: f"`{m.group(1).split('.')[-1]}`", summary)
        _api[name] = (rendered.get(f"rs_interp.{name}", ""), summary)
        if not text.strip():
            problems.append(f"rs_interp.{name} has no docstring")
        elif ">>>" not in text:
            if name not in NO_EXAMPLE_YET:
                problems.append(f"rs_interp.{name}'s docstring has no example (>>>)")
        else:
            examples.append((name, obj, text))
        if name in NO_EXAMPLE_YET and ">>>" in text:  # not an error: the change that adds examples may land first
            log.info(f"rs_interp.{name} has an example now: take it off NO_EXAMPLE_YET in docs/_hooks/rs_docs.py")
    for p in problems:
        log.warning(p)
    _doctests(examples)


def _doctests(examples) -> None:
    """Run the reference's examples. ``RS_INTERP_DOCS_DOCTEST``: ``all`` (default) runs every one;
    ``attributes`` only those pytest's ``--doctest-modules`` cannot see (attribute docstrings, which
    Python does not keep at run time): tests/integration/test_docs.py builds with it, since its pytest pass runs
    the others already; ``none`` runs none."""
    import importlib

    which = os.environ.get("RS_INTERP_DOCS_DOCTEST", "all")
    if which not in ("all", "attributes", "none"):
        raise PluginError(f"RS_INTERP_DOCS_DOCTEST must be all, attributes or none, got {which!r}")
    if which == "none":
        return
    parser = doctest.DocTestParser()
    start, n = time.perf_counter(), 0
    for name, obj, text in examples:
        if which == "attributes" and obj.kind.value != "attribute":
            continue
        module = obj.module.path if obj.kind.value != "module" else obj.path
        module = "rs_interp.hooks" if module.split(".")[0] == "hooks" else module
        globs = dict(vars(importlib.import_module(module)))
        test = parser.get_doctest(text, globs, f"rs_interp.{name}", str(obj.filepath), obj.lineno or 0)
        out = io.StringIO()
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        runner.run(test, out=out.write)
        n += 1
        if runner.failures:
            log.warning(f"the example of rs_interp.{name} failed:\n{out.getvalue()}")
    log.info(f"ran the examples of {n} public names in {time.perf_counter() - start:.1f} s ({which})")
