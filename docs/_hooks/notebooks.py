"""The notebooks as tutorial pages: stored outputs, their freshness record, and the Markdown they become.

The docs render ``notebooks/*.ipynb`` from the outputs stored in them, never by running them:
``tests/integration/test_notebooks.py`` already executes every notebook (minutes of CPU), and the docs build has
a budget of seconds. What keeps the stored outputs honest is the record written beside them,
``metadata["rs_interp_docs"]["code_sha256"]``: the digest of the code cells that produced them.
Editing a cell without re-running the notebook changes the digest, and ``tests/integration/test_docs.py`` fails,
naming the notebook and the command that refreshes it::

    bash scripts/build_docs.sh --execute-notebooks      # runs every notebook, stores its outputs

Figures are stored as plotly's JSON (``PLOTLY_RENDERER=plotly_mimetype`` in the kernel): no copy of
plotly.js in a notebook, and the docs draw them with the site's local plotly.js.
"""

from __future__ import annotations

import hashlib
import html
import json
import os
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = ROOT / "notebooks"
RECORD = "rs_interp_docs"
PLOTLY_MIME = "application/vnd.plotly.v1+json"
REFRESH = "bash scripts/build_docs.sh --execute-notebooks"


def notebooks() -> list[Path]:
    return sorted(NOTEBOOK_DIR.glob("*.ipynb"))


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def code_digest(nb: dict) -> str:
    """sha256 of the notebook's code cells, in order: what the stored outputs were computed from."""
    cells = [_source(c) for c in nb["cells"] if c["cell_type"] == "code"]
    return hashlib.sha256(json.dumps(cells).encode()).hexdigest()


def read(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def staleness(nb: dict) -> list[str]:
    """Why the stored outputs of ``nb`` cannot be shown as its outputs (empty when they can): no
    record, a record of other code, a cell never run or run out of order, an error output."""
    problems = []
    record = nb.get("metadata", {}).get(RECORD)
    if not record:
        problems.append("no stored outputs (no rs_interp_docs record)")
    elif record.get("code_sha256") != code_digest(nb):
        problems.append("the code cells changed since their outputs were stored")
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    counts = [c.get("execution_count") for c in code]
    if counts != list(range(1, len(code) + 1)):
        problems.append(f"cells not run once each, top to bottom (execution counts {counts})")
    for i, c in enumerate(code):
        for o in c.get("outputs", []):
            if o.get("output_type") == "error":
                problems.append(f"code cell {i + 1} stored an error: {o.get('ename')}: {o.get('evalue')}")
    return problems


def execute(path: Path, *, timeout: int = 1800) -> dict:
    """Run ``path`` top to bottom in a fresh kernel and store its outputs and their record in the file."""
    import nbformat
    from nbclient import NotebookClient

    os.environ["PLOTLY_RENDERER"] = "plotly_mimetype"  # the kernel inherits it: figures as JSON only
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":  # warnings (with this machine's paths) are not the tutorial's output
            cell.outputs = [o for o in cell.outputs if not (o.output_type == "stream" and o.name == "stderr")]
    import rs_interp._backend as backend

    nb.metadata[RECORD] = {"code_sha256": code_digest(nb), "transformer_lens": backend.TL_VERSION,
                           "refresh": REFRESH}
    problems = staleness(nb)
    if problems:
        raise RuntimeError(f"{path.name}: {'; '.join(problems)}")
    nbformat.write(nb, path)
    return nb


def _text(o: dict, key: str) -> str:
    v = o.get(key, "")
    return "".join(v) if isinstance(v, list) else v


def _fence(text: str, lang: str = "text") -> str:
    text = text.rstrip("\n")
    ticks = "````" if "```" in text else "```"
    return f"{ticks}{lang}\n{text}\n{ticks}"


def to_markdown(nb: dict, name: str, figure: Callable[[dict], str]) -> str:
    """The page of notebook ``name``: its Markdown cells as written, each code cell as Python, each
    stored output after it (text as text, plotly figures through ``figure(spec)``, PNG images inline).

    Raises ``ValueError`` when the stored outputs are stale (see :func:`staleness`)."""
    problems = staleness(nb)
    if problems:
        raise ValueError(f"notebooks/{name}.ipynb: {'; '.join(problems)}; refresh with `{REFRESH}`")
    parts: list[str] = []
    for i, cell in enumerate(nb["cells"]):
        src = _source(cell)
        if cell["cell_type"] == "markdown":
            parts.append(src)
            if i == 0:
                parts.append(f'!!! note "A notebook"\n    This page is `notebooks/{name}.ipynb` with the outputs stored when it '
                             f"last ran (under TransformerLens {nb['metadata'][RECORD].get('transformer_lens', '?')}). "
                             f"`tests/integration/test_notebooks.py` runs it on every CI run; `{REFRESH}` stores fresh outputs.")
            continue
        if cell["cell_type"] != "code":
            continue
        parts.append(_fence(src, "python"))
        for o in cell.get("outputs", []):
            kind = o.get("output_type")
            if kind == "stream" and o.get("name") != "stderr":
                parts.append(_fence(_text(o, "text")))
            elif kind in ("execute_result", "display_data"):
                data: dict[str, Any] = o.get("data", {})
                if PLOTLY_MIME in data:
                    parts.append(figure(data[PLOTLY_MIME]))
                elif "image/png" in data:
                    png = _text({"v": data["image/png"]}, "v").replace("\n", "")
                    parts.append(f'<img alt="output of cell {i}" src="data:image/png;base64,{png}">')
                elif "text/plain" in data:
                    parts.append(_fence(_text(data, "text/plain")))
                elif "text/html" in data:
                    parts.append(f'<div class="rs-output">{_text(data, "text/html")}</div>')
    return "\n\n".join(parts) + "\n"


def title(nb: dict, name: str) -> str:
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            for line in _source(cell).splitlines():
                if line.startswith("# "):
                    return html.unescape(line[2:].strip())
    return name


if __name__ == "__main__":  # bash scripts/build_docs.sh --execute-notebooks [NAME ...]
    import sys
    import time

    names = set(sys.argv[1:])
    for path in notebooks():
        if names and path.stem not in names:
            continue
        start = time.perf_counter()
        execute(path)
        print(f"{path.name}: ran and stored in {time.perf_counter() - start:.0f} s", file=sys.stderr)
