"""A griffe extension for rs_interp's docstrings, as mkdocstrings reads them (mkdocs.yml).

- ``rs_interp.hooks`` lives in the top-level folder ``hooks/`` (setup.py installs it under
  rs_interp): it is loaded from there and attached to the package, so ``::: rs_interp.hooks`` works.
- Doctest examples (``>>>`` lines and their output, up to a blank line) become ``pycon`` code blocks:
  Markdown would otherwise read ``>>>`` as nested quotes.
- A member whose docstring points at its module's ("(module docstring)") gets the module's docstring
  appended as a note: the definitions it points at are on the page.
- Sphinx roles (``:func:`name```, ``:class:`~rs_interp.X```, ...) become cross-references where the
  target is rendered by the reference, and code where it exists but is not rendered. A role naming
  nothing that exists is logged as a warning, which fails the strict build (a broken cross-reference).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import griffe

log = logging.getLogger("mkdocs.hooks.griffe_rs")
ROOT = Path(__file__).resolve().parents[2]

#: Modules whose every public member the reference renders (beside the names of ``rs_interp.__all__``).
DOCUMENTED_MODULES = ("rs_interp.hooks", "rs_interp.ui.plots", "rs_interp.circuits.tracr")
_ROLE = re.compile(r":(?:py:)?(func|class|meth|attr|data|mod|obj|exc):`(~?)([\w.]+)`")


def fence_doctests(text: str) -> str:
    """Wrap each run of doctest lines (``>>>`` through the next blank line) in a ``pycon`` fence; lines
    already inside a fence stay as they are (a docstring reached twice is fenced once)."""
    out, lines, i, fenced = [], text.split("\n"), 0, False
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip()
        if stripped.startswith("```"):
            fenced = not fenced
        elif stripped.startswith(">>>") and not fenced:
            indent = line[: len(line) - len(stripped)]
            block = []
            while i < len(lines) and lines[i].strip():
                block.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].lstrip())
                i += 1
            out += [f"{indent}```pycon", *(f"{indent}{b}" for b in block), f"{indent}```"]
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


_SHARED = re.compile(r"^(\s+)(\w+(?:, \w+)+): (.*)$")


def split_shared_params(text: str) -> str:
    """``a, b: description`` in an ``Args:`` section becomes one entry per name (the same text),
    as the Google style griffe parses wants; the signature check then sees every name."""
    out, lines, i, in_args = [], text.split("\n"), 0, None
    while i < len(lines):
        line = lines[i]
        if line.strip() in ("Args:", "Arguments:", "Parameters:", "Attributes:"):
            in_args = len(line) - len(line.lstrip())
        elif line.strip() and in_args is not None and len(line) - len(line.lstrip()) <= in_args:
            in_args = None
        m = _SHARED.match(line) if in_args is not None else None
        if not m:
            out.append(line)
            i += 1
            continue
        indent, names, first = m.groups()
        body = [first]
        i += 1
        while i < len(lines) and lines[i].strip() and len(lines[i]) - len(lines[i].lstrip()) > len(indent):
            body.append(lines[i])
            i += 1
        for name in names.split(", "):
            out.append(f"{indent}{name}: {body[0]}")
            out += body[1:]
    return "\n".join(out)


_POINTER = re.compile(r"\((?:see )?the module docstring\)|\(module docstring\)|(?:see )?the module docstring")


def with_module_definitions(obj, text: str) -> str:
    """A docstring that points at its module's docstring ("(module docstring)", "see the module
    docstring") gets that docstring, the definitions it points at, appended as a note: the reference
    renders members, never their modules' docstrings."""
    if not _POINTER.search(text) or obj.is_module:
        return text
    mod = obj.module
    if mod is None or not mod.docstring:
        return text
    body = split_shared_params(mod.docstring.value).strip()  # fenced with the rest (fence_doctests), once
    note = "\n".join("    " + line if line.strip() else "" for line in body.split("\n"))
    text = _POINTER.sub(lambda m: "(the definitions below)" if m.group(0).startswith("(") else "the definitions below", text)
    return f'{text.rstrip()}\n\n!!! note "The definitions (from `{mod.path}`)"\n{note}\n'


class RsInterpDocs(griffe.Extension):
    def __init__(self) -> None:
        super().__init__()
        self._public: dict[str, str] = {}  # canonical path -> the path the reference renders it under

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs) -> None:
        if pkg.path != "rs_interp":
            return
        if "hooks" not in loader.modules_collection.members:
            hooks = loader.load("hooks")  # found in the repository's root: mkdocstrings' `paths: [.]`
        else:
            hooks = loader.modules_collection["hooks"]
        pkg.set_member("hooks", hooks)
        loader.resolve_aliases(implicit=False, external=False)
        self._index(pkg, loader)
        for obj in self._rendered(pkg, loader):
            if obj.docstring:
                text = with_module_definitions(obj, split_shared_params(obj.docstring.value))
                obj.docstring.value = self._roles(fence_doctests(text), obj, loader)

    def _index(self, pkg: griffe.Module, loader) -> None:
        """Which objects the reference renders, under which path (autorefs' identifiers)."""
        for name in _all(pkg):
            try:
                target = pkg[name]
                self._public[target.canonical_path] = f"rs_interp.{name}"
                self._public[f"rs_interp.{name}"] = f"rs_interp.{name}"
            except (KeyError, griffe.AliasResolutionError):
                continue
        for mod_path in _directive_modules(loader):  # rendered for their docstrings: :mod: links land there
            self._public.setdefault(mod_path, mod_path)
        for mod_path in DOCUMENTED_MODULES:
            mod = _get(loader, mod_path)
            if mod is None:
                continue
            self._public.setdefault(mod_path, mod_path)
            self._public.setdefault(mod.canonical_path, mod_path)
            for name in _all(mod):
                member = _get(loader, f"{mod_path}.{name}")
                if member is not None:
                    path = self._public.get(member.canonical_path, f"{mod_path}.{name}")
                    self._public.setdefault(member.canonical_path, path)
                    self._public.setdefault(f"{mod_path}.{name}", path)

    def _rendered(self, pkg: griffe.Module, loader):
        seen = set()
        roots = [pkg[name] for name in _all(pkg) if name != "hooks"]
        roots += [m for m in (_get(loader, p) for p in (*DOCUMENTED_MODULES, *_directive_modules(loader))) if m is not None]
        stack = list(roots)
        while stack:
            obj = stack.pop()
            try:
                obj = obj.final_target if obj.is_alias else obj
            except griffe.AliasResolutionError:
                continue
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            yield obj
            if obj.is_class or obj.is_module:
                stack += [m for m in obj.members.values() if not m.is_alias]

    def _roles(self, text: str, obj, loader) -> str:
        def resolve(m: re.Match) -> str:
            _role, short, target = m.groups()
            shown = target.split(".")[-1] if short else target
            found = self._find(target, obj, loader)
            if found is None:
                log.warning(f"{obj.path}: broken cross-reference {m.group(0)} (no such object)")
                return f"`{shown}`"
            public = self._public.get(found.canonical_path) or self._public.get(found.path)
            return f"[`{shown}`][{public}]" if public else f"`{shown}`"

        return _ROLE.sub(resolve, text)

    def _find(self, target: str, obj, loader):
        """The object a role names, looked up as Sphinx would: in the object (a class's members), its
        parent, its module, its package, then as an absolute path (``rs_interp.`` optional)."""
        mod = obj if obj.is_module else obj.module
        scopes = [obj] if (obj.is_class or obj.is_module) else []
        scopes += [s for s in (obj.parent, mod, mod.parent) if s is not None]
        name = target.lstrip(".")
        relative = mod if (mod.is_package or mod.is_subpackage) else (mod.parent or mod)  # ".x" in a package's __init__ is its own x
        for scope in scopes if not target.startswith(".") else [relative]:
            try:
                return _final(scope[name])
            except (KeyError, ValueError, griffe.AliasResolutionError):
                continue
        for path in (name, f"rs_interp.{name}"):
            found = _get(loader, path)
            if found is not None:
                return _final(found)
        return None


def _directive_modules(loader) -> list[str]:
    """The modules the reference pages render by a ``::: rs_interp.<module>`` line of their own (for
    their docstrings, the definitions their members point to)."""
    out = []
    for md in sorted((ROOT / "docs" / "reference").glob("*.md")):
        for path in re.findall(r"^::: (rs_interp\.[\w.]+)", md.read_text(), re.M):
            found = _get(loader, path)
            if found is not None and not found.is_alias and found.is_module and path not in out:
                out.append(path)
    return out


def _final(obj):
    try:
        return obj.final_target if obj.is_alias else obj
    except griffe.AliasResolutionError:
        return obj


def _get(loader, path: str):
    try:
        return loader.modules_collection[path]
    except (KeyError, ValueError, griffe.AliasResolutionError):
        return None


def _all(mod) -> list[str]:
    exports = mod.exports
    if exports is None:
        return [n for n in mod.members if not n.startswith("_")]
    return [e if isinstance(e, str) else e.name for e in exports]
