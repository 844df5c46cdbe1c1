"""Issue 61 item 4: every message in the tree is sized for its reader (the rules: docs/project/testing.md, "Messages").

What this file covers: every place in rs_interp/ and hooks/ that builds a message, read from the sources (so a
refusal no test triggers is checked too): each call of an exception class (a name ending in Error, Exception,
Unavailable or Warning: raised, returned or stored) and each ``warnings.warn``. Its first argument is read as
text: a literal, an f-string, a sum of those, or a name bound to one (in the function, the module, or imported
from another module of the tree), or a call of a module function that returns one. Of that text:

1. the literal characters, the constants it names and :data:`NOMINAL` characters for every other value are at
   most :data:`rs_interp._messages.LIMIT`;
2. a collection is never shown whole: a join, ``sorted``, ``list``, ``set`` or comprehension inside the text goes
   through ``few`` (a few entries and how many more; a constant tuple such as ``TASK_NAMES`` is fine), and
   another library's text through ``clip`` (no ``[:n]``, which cuts mid-word and says nothing);
3. it does not end mid-sentence (its last literal word is not a function word such as "are" or "the");
4. advice is in the caller's terms: the command line's modules never advise an API keyword (``names=``), and the
   library outside ``ui`` and ``reproduce`` never a command-line option (``--size``).

A message whose text exists only at run time (the certificate's refusal, assembled from measured reasons) is
listed in :data:`MEASURED` with the test that measures its real length; a new one fails here until it is.
The values interpolated at run time (paths, a user's value) are measured by the tests that trigger the
refusals: tests/test_files.py (every file error), tests/integration/test_certificate_api.py (every helper's
refusal), tests/ui/test_cli.py (the command line's task refusal) and the task tests.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from rs_interp._messages import LIMIT

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted([*(ROOT / "rs_interp").rglob("*.py"), *(ROOT / "hooks").rglob("*.py")])
#: The width counted for a value only known at run time (a number, a name, a short repr).
NOMINAL = 12
_EXCEPTION = re.compile(r"(Error|Exception|Unavailable|Warning)$")
#: Words a sentence does not end with.
DANGLING = {"a", "an", "the", "are", "is", "of", "to", "whose", "and", "or", "with", "for", "by", "in", "that",
            "which", "than", "as", "from", "on", "at", "be", "its", "their", "pass"}
#: The command line's own modules (their messages speak of options, never of keywords).
COMMAND_LINE = {"rs_interp/ui/cli.py", "rs_interp/ui/_args.py", "rs_interp/ui/_circuit_args.py"}
#: Messages assembled at run time, and the test that measures each one's length.
MEASURED = {
    ("rs_interp/_files.py", "message"): "tests/test_files.py (FileError passes its callers' messages on)",
    ("rs_interp/exact/certificate.py", "why"): "tests/integration/test_certificate_api.py",
    ("rs_interp/_files.py", "str(err)"): "tests/test_files.py (a refusal re-raised as a FileError, measured there)",
    ("rs_interp/models/checkpoints.py", "str(err)"): "tests/test_files.py (a FileError re-raised as a CheckpointError)",
    ("rs_interp/exact/needs.py", "helper"): "tests/exact/test_needs.py (the tables' KeyError: the helper's name, as a dict's)",
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = ("rs_interp", *rel.parts[1:]) if rel.parts[0] == "rs_interp" else ("rs_interp.hooks", *rel.parts[1:])
    return ".".join(parts).removesuffix(".__init__")


@cache
def _modules() -> dict[str, tuple[Path, ast.Module]]:
    return {_module_name(p): (p, ast.parse(p.read_text())) for p in FILES}


@cache
def _top_level(module: str) -> dict[str, ast.AST]:
    """A module's top-level names: strings assigned, functions, and names imported from the tree."""
    path, tree = _modules()[module]
    names: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            names |= {t.id: node.value for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            names[node.target.id] = node.value
        elif isinstance(node, ast.FunctionDef):
            names[node.name] = node
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
            source = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                if source in _modules():
                    names[alias.asname or alias.name] = ast.Name(id=f"{source}:{alias.name}")
    return names


def _text(node: ast.AST, scope: dict[str, ast.AST], module: str, depth: int = 0) -> tuple[str, list[ast.AST]] | None:
    """The literal text of a message expression (a NUL byte where a value goes) and the value expressions, or
    None where it is only known at run time."""
    if depth > 6:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value, []
    if isinstance(node, ast.JoinedStr):
        text, values = "", []
        for part in node.values:
            if isinstance(part, ast.Constant):
                text += part.value
            else:
                resolved = _text(part.value, scope, module, depth + 1) if isinstance(part.value, (ast.Name, ast.Call)) else None
                if resolved is not None and not resolved[1] and len(resolved[0]) > NOMINAL:  # a constant's own text
                    text += resolved[0]
                else:
                    text, values = text + "\0", values + [part.value]
        return text, values
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left, scope, module, depth + 1), _text(node.right, scope, module, depth + 1)
        return (left[0] + right[0], left[1] + right[1]) if left and right else None
    if isinstance(node, ast.Name):
        if ":" in node.id:  # imported from another module of the tree
            source, name = node.id.split(":")
            target = _top_level(source).get(name)
            return None if target is None else _text(target, {}, source, depth + 1)
        bound = scope.get(node.id, _top_level(module).get(node.id))
        if isinstance(bound, ast.FunctionDef):
            return None
        return None if bound is None else _text(bound, scope if node.id in scope else {}, module, depth + 1)
    if isinstance(node, ast.FunctionDef):  # a module function that returns a message: its last return
        returns = [n.value for n in ast.walk(node) if isinstance(n, ast.Return) and n.value is not None]
        return _text(returns[-1], {}, module, depth + 1) if returns else None
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Attribute) and node.func.attr == "format":
            return _text(node.func.value, scope, module, depth + 1)
        if isinstance(node.func, ast.Name) and isinstance(_top_level(module).get(node.func.id), ast.FunctionDef):
            return _text(_top_level(module)[node.func.id], {}, module, depth + 1)
    return None


def _unbounded(value: ast.AST) -> str | None:
    """Why a value shown in a message can grow without bound (a collection shown whole, text cut by a slice)."""
    if isinstance(value, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        return "a comprehension shown whole"
    if isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Slice):
        return "a slice ([:n] cuts mid-word without saying so: use clip or few)"
    if not isinstance(value, ast.Call):
        return None
    name = value.func.id if isinstance(value.func, ast.Name) else value.func.attr if isinstance(value.func, ast.Attribute) else ""
    arg = value.args[0] if value.args else None
    constant = isinstance(arg, ast.Name) and arg.id.isupper() or isinstance(arg, (ast.Tuple, ast.List))
    if name in ("repr", "str") and arg is not None:
        return _unbounded(arg)
    if name == "tuple" and arg is not None and "shape" in ast.unparse(arg):
        return None  # a shape
    if name in ("join", "sorted", "list", "set", "tuple", "dict") and not constant:
        return f"{name}(...) shown whole (use few)"
    return None


def _parents(tree: ast.Module) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _outer(node: ast.AST, parents: dict[ast.AST, ast.AST], kind: type) -> ast.AST | None:
    while node in parents:
        node = parents[node]
        if isinstance(node, kind):
            return node
    return None


@cache
def _sites() -> tuple[tuple[str, int, str | None, list[ast.AST], ast.Call], ...]:
    """(file, line, text, values, call) for every message built in the tree; text None where only known at run time."""
    out = []
    for module, (path, tree) in _modules().items():
        rel, parents = str(path.relative_to(ROOT)), _parents(tree)
        scopes: dict[ast.AST, dict[str, ast.AST]] = {}
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.args):
            name = (call.func.id if isinstance(call.func, ast.Name)
                    else call.func.attr if isinstance(call.func, ast.Attribute) else "")
            if name == "__init__" and ast.unparse(call.func).startswith("super()"):  # an exception class's own message
                cls = _outer(call, parents, ast.ClassDef)
                name = "Error" if cls and any(_EXCEPTION.search(n) for n in [cls.name, *map(ast.unparse, cls.bases)]) else ""
            if not (_EXCEPTION.search(name) or name == "warn"):
                continue
            fn = _outer(call, parents, (ast.FunctionDef, ast.AsyncFunctionDef))
            if fn is not None and fn not in scopes:  # the function's local names bound to a value
                scopes[fn] = {t.id: n.value for n in ast.walk(fn) if isinstance(n, ast.Assign) for t in n.targets
                              if isinstance(t, ast.Name)}
            resolved = _text(call.args[0], scopes.get(fn, {}), module)
            out.append((rel, call.lineno, *(resolved or (None, [])), call))
    return tuple(out)


def _problems(rel: str, text: str, values: list[ast.AST]) -> list[str]:
    out = []
    size = len(text.replace("\0", "")) + NOMINAL * len(values)
    if size > LIMIT:
        out.append(f"{size} characters (with {NOMINAL} per value) > {LIMIT}")
    out += [why for why in map(_unbounded, values) if why]
    last = text.rstrip()
    word = re.search(r"([A-Za-z]+)\W*$", last.split("\0")[-1]) if not last.endswith("\0") else None
    if word and word.group(1).lower() in DANGLING and not re.search(r"[.!?)]\s*$", last):
        out.append(f"ends mid-sentence ({word.group(1)!r})")
    plain = text.replace("\0", " ")
    if rel in COMMAND_LINE and (kw := re.search(r"(?<![-\w.])[a-z_]{2,}=(?![=\w-]*\))", plain)):
        out.append(f"advises the API keyword {kw.group()!r} on the command line")
    if not rel.startswith(("rs_interp/ui/", "rs_interp/reproduce/")) and (opt := re.search(r"(?<![\w-])--[a-z][\w-]*", plain)):
        if "torchrun" not in plain:  # torchrun's own options, named where the library runs under it
            out.append(f"advises the command-line option {opt.group()!r} in the library")
    return out


def test_the_scan_reads_the_tree():
    """The scan finds the messages it is about (so an empty scan cannot pass): the measured case of the issue
    is one of them, and almost every message is read as text."""
    sites = list(_sites())
    assert len(sites) > 400
    assert any(rel == "rs_interp/tasks/task.py" and text and "not single tokens" in text for rel, _, text, _, _ in sites)
    assert sum(text is None for _, _, text, _, _ in sites) <= len(MEASURED) + 3


def test_the_rules_catch_what_they_are_about():
    """Each rule fails on a message that breaks it."""
    def problems(source: str, rel: str = "rs_interp/x.py") -> list[str]:
        call = ast.parse(source).body[0].value
        text, values = _text(call.args[0], {}, "rs_interp")
        return _problems(rel, text, values)

    assert problems("ValueError(f'{n} of them are not single tokens: {\", \".join(bad)}; pass names= lists whose entries are')")
    assert any("shown whole" in p for p in problems("ValueError(f'unknown {sorted(fields)}')"))
    assert any("slice" in p for p in problems("ValueError(f'failed ({str(err)[:200]})')"))
    assert any("characters" in p for p in problems("ValueError('" + "x" * (LIMIT + 1) + "')"))
    assert any("keyword" in p for p in problems("ValueError('pass names= a list')", "rs_interp/ui/cli.py"))
    assert any("option" in p for p in problems("ValueError('ask for a larger --size')"))
    assert not problems("ValueError(f'unknown {few(sorted(fields))}; the tasks are {\", \".join(TASK_NAMES)}')")


@pytest.mark.parametrize("folder", sorted({str(p.relative_to(ROOT).parent) for p in FILES}))
def test_every_message_is_sized_for_its_reader(folder):
    bad, unread = [], []
    for rel, line, text, values, call in _sites():
        if str(Path(rel).parent) != folder:
            continue
        if text is None:
            if (rel, ast.unparse(call.args[0])) not in MEASURED:
                unread.append(f"{rel}:{line}: {ast.unparse(call.args[0])[:80]}")
            continue
        bad += [f"{rel}:{line}: {why}: {text.replace(chr(0), '{}')[:90]!r}" for why in _problems(rel, text, values)]
    assert not unread, "messages known only at run time, not in MEASURED (name the test that measures them):\n" + "\n".join(unread)
    assert not bad, "\n".join(bad)
