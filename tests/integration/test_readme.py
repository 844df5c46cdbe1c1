"""The README's example runs as written, its two set-up commands are the scripts CI uses, and the
examples that moved from the README to the documentation run as written there (under both
TransformerLens versions: the docs build, which runs every page's examples, runs in one pass only)."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"


def _block(text: str, heading: str, where: str) -> str:
    """The first Python block after ``heading`` (an executed ```` ```python exec ```` block counts)."""
    match = re.search(heading + r".*?```python(?: exec)?\n(.*?)```", text, re.S)
    assert match, f"no Python block after {heading!r} in {where}"
    return match.group(1)


def test_notebook_example_runs_as_written(capsys):
    block = _block(README, r"## In a notebook\s+", "README.md")
    assert len(block.strip().splitlines()) <= 12, "the README's example is the short one; longer ones live in docs/"
    exec(compile(block, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "Score(" in out and "L0H" in out


def test_first_session_example_runs_as_written(capsys):
    """README's former notebook example, now docs/getting-started.md's first session."""
    page = (DOCS / "getting-started.md").read_text()
    exec(compile(_block(page, r"## A first session\s+", "docs/getting-started.md"), "docs/getting-started.md", "exec"), {})
    out = capsys.readouterr().out
    assert "Score(" in out and "L0H" in out


def test_circuits_example_runs_as_written(capsys):
    page = (DOCS / "capabilities" / "circuits.md").read_text()
    exec(compile(_block(page, r"## Every edge, estimated", "docs/capabilities/circuits.md"), "circuits.md", "exec"), {})
    out = capsys.readouterr().out
    assert "EAP-IG" in out and re.search(r"\('[\w.]+', '[\w.]+'\)", out), out  # edges print as (sender, receiver)


def test_two_setup_commands_and_ci():
    commands = re.search(r"## Set-up: two commands.*?```bash\n(.*?)```", README, re.S).group(1).strip().splitlines()
    assert [c.split("#")[0].split()[:2] for c in commands] == [["bash", "scripts/reproduce.sh"], ["bash", "scripts/test.sh"]]
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    assert "-m ruff check ." in (ROOT / "scripts" / "test.sh").read_text()  # lint and import order, in the test command


def test_the_readme_points_to_the_docs_not_outside_the_repository():
    assert "scripts/build_docs.sh" in README and (ROOT / "scripts" / "build_docs.sh").is_file()
    assert "../shared" not in README and "The Transformer Block and the Residual Stream" in README
    for path in re.findall(r"`((?:docs|scripts)/[\w./-]+)`", README):
        assert (ROOT / path).exists(), f"README names {path}, which does not exist"


def test_the_readme_says_how_to_install_into_your_own_kernel():
    """Issue 42: the README's two commands make their own venvs; it also says, inline (not a third set-up
    command), how to install the clone into the user's own environment (tests/integration/test_packaging.py
    installs the wheel that way, non-editably, and imports it from the clone's root and notebooks/)."""
    section = README.split("## In your own kernel", 1)[1].split("\n## ", 1)[0]
    assert "pip install torch==2.13.0" in section and "pip install /path/to/this/clone" in section and "%pip install" in section
    assert "```" not in section
