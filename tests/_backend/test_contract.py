"""The backend's contract (:class:`rs_interp._backend.contract.Backend`): each TransformerLens version's module
implements every member with the contract's signature, read from both sources (whichever version is installed)
and, for the installed one, as imported; the package reads its version's module through the contract alone.

A signature is the decorators, each parameter's kind, name, default and annotation, and the return annotation;
a version may annotate a parameter ``Any`` where the contract names a type (it accepts more)."""

from __future__ import annotations

import ast
import inspect
import pathlib

import pytest

import rs_interp._backend as backend
from rs_interp._backend.contract import CLASSES, Backend

BACKEND = pathlib.Path(backend.__file__).parent
ANY = "Any"


def _parse(name: str) -> ast.Module:
    return ast.parse((BACKEND / f"{name}.py").read_text())


def _ast_signature(fn: ast.FunctionDef, *, method: bool) -> tuple:
    """``(decorators, [(kind, name, default, annotation)], return annotation)`` as the source writes them."""
    a, text = fn.args, lambda node: None if node is None else ast.unparse(node)
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + a.defaults
    params = [("POSITIONAL_ONLY" if i < len(a.posonlyargs) else "POSITIONAL_OR_KEYWORD", p.arg, text(d),
               text(p.annotation)) for i, (p, d) in enumerate(zip(positional, defaults))]
    params += [("VAR_POSITIONAL", a.vararg.arg, None, text(a.vararg.annotation))] if a.vararg else []
    params += [("KEYWORD_ONLY", p.arg, text(d), text(p.annotation)) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    params += [("VAR_KEYWORD", a.kwarg.arg, None, text(a.kwarg.annotation))] if a.kwarg else []
    return [text(d) for d in fn.decorator_list], params[1:] if method else params, text(fn.returns)


def _runtime_signature(fn, *, method: bool) -> tuple:
    """The same, as imported (decorators are not visible: ``None`` in their place)."""
    sig, text = inspect.signature(fn), lambda v, empty: None if v is empty else str(v)
    params = [(p.kind.name, p.name, None if p.default is p.empty else repr(p.default), text(p.annotation, p.empty))
              for p in sig.parameters.values()]
    return None, params[1:] if method else params, text(sig.return_annotation, sig.empty)


def _contract() -> tuple[set[str], dict[str, ast.FunctionDef]]:
    """The classes the contract names and its functions (by name), read from its source."""
    (cls,) = [n for n in _parse("contract").body if isinstance(n, ast.ClassDef) and n.name == "Backend"]
    assert not [n for n in cls.body if isinstance(n, (ast.AnnAssign, ast.Assign))], "its members are functions"
    return set(CLASSES), {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}


def _module_names(tree: ast.Module) -> dict[str, ast.FunctionDef | None]:
    """What a version's module binds at its top level: a function (followed into the sibling module it is
    imported from), or None for any other binding (an imported class, an assignment)."""
    out: dict[str, ast.FunctionDef | None] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = node
        elif isinstance(node, ast.ImportFrom):
            sibling = _module_names(_parse(node.module)) if node.level == 1 and node.module else {}
            out |= {a.asname or a.name: sibling.get(a.name) for a in node.names}
        elif isinstance(node, ast.ClassDef):
            out[node.name] = None
        elif isinstance(node, ast.Import):
            out |= {a.asname or a.name: None for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {t.id: None for t in targets if isinstance(t, ast.Name)}
    return out


def _differs(want: tuple, got: tuple) -> bool:
    """Whether ``got`` (a version's signature) is not ``want`` (the contract's), ``Any`` accepted for a type."""
    (w_dec, w_params, w_ret), (g_dec, g_params, g_ret) = want, got
    if (g_dec is not None and g_dec != w_dec) or w_ret != g_ret or len(w_params) != len(g_params):
        return True
    return any(w[:3] != g[:3] or (w[3] != g[3] and g[3] != ANY) for w, g in zip(w_params, g_params))


def _mismatches(tree: ast.Module) -> list[str]:
    """Where a version's module (its parsed source) breaks the contract, each named."""
    classes, functions = _contract()
    names = _module_names(tree)
    out = [f"{c}: missing" for c in sorted(classes) if c not in names]
    for name, fn in sorted(functions.items()):
        if names.get(name) is None:
            out.append(f"{name}: no function")
        elif _differs(_ast_signature(fn, method=True), _ast_signature(names[name], method=False)):
            want = ast.unparse(fn.args).removeprefix("self").removeprefix(", ")
            out.append(f"{name}: ({ast.unparse(names[name].args)}) is not the contract's ({want})")
    exported = [ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                and [getattr(t, "id", None) for t in n.targets] == ["__all__"]]
    out += [f"{name}: not in __all__" for names_all in exported for name in sorted(classes | set(functions))
            if name not in names_all]  # a static checker matches a module to the protocol by what it exports
    extra = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")
             and n.name not in functions]
    return out + [f"{name}: public, not in the contract" for name in extra]


@pytest.mark.parametrize("version", ["tl3", "tl4"])
def test_each_version_implements_the_contract(version):
    """Every member, with the contract's signature, and no public function beside them (both versions read from
    their sources: a member missing from one would otherwise fail only under that version)."""
    assert _mismatches(_parse(version)) == []


def test_the_installed_version_as_imported():
    """The installed version's module as Python sees it: a :class:`Backend`, each function's signature the
    contract's (through ``contextlib.contextmanager``'s wrapper too)."""
    classes, functions = _contract()
    assert isinstance(backend._impl, Backend) and all(isinstance(getattr(backend._impl, c), type) for c in classes)
    wrong = [name for name in functions
             if _differs(_runtime_signature(getattr(Backend, name), method=True),
                         _runtime_signature(getattr(backend._impl, name), method=False))]
    assert wrong == []


def test_the_package_reads_the_contract_alone():
    """``rs_interp._backend`` reads its version's module (``_impl``, imported as ``_version``) only through the
    contract's members, and every member is read (no dead part of the contract)."""
    read = {n.attr for n in ast.walk(_parse("__init__")) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id in ("_impl", "_version")}
    classes, functions = _contract()
    assert read == classes | set(functions)


SCALE = "def attn_scale(model: Model, layer: int)"


@pytest.mark.parametrize("old, new, named", [
    (SCALE, "def attn_scale_gone(model: Model, layer: int)", "attn_scale"),  # removed
    (SCALE, "def attn_scale(model: Model, block: int)", "attn_scale"),  # a parameter renamed
    (SCALE, "def attn_scale(model: Model, layer: str)", "attn_scale"),  # an annotation changed
    (SCALE, "def attn_scale(model: Model, layer: int = 0)", "attn_scale"),  # a default added
    (SCALE, "def attn_scale(model: Model, *, layer: int)", "attn_scale"),  # a kind changed
    (SCALE, "def attn_scale(model: Model, layer: int) -> int:\n    pass\n\n\ndef x(model: Model, layer: int)",
     "attn_scale"),  # the return annotation changed (the original renamed away)
    ("@contextlib.contextmanager\ndef per_head_inputs(", "def per_head_inputs(", "per_head_inputs"),  # undecorated
    (SCALE, "def extra() -> None:\n    pass\n\n\n" + SCALE, "extra"),  # a public function beside the contract
    ("\n\ndef config_fields(", "\n__all__ = ['Model']\n\n\ndef config_fields(", "config_fields"),  # not exported
])
def test_a_broken_contract_is_named(old, new, named):
    """The check can fail: each edit of tl3's source (a member removed, a parameter renamed, re-annotated,
    given a default or another kind, another return type, a decorator lost, a public function beside the
    contract, an ``__all__`` that leaves a member out) is named."""
    source = (BACKEND / "tl3.py").read_text()
    assert old in source
    broken = _mismatches(ast.parse(source.replace(old, new, 1)))
    assert [m for m in broken if m.startswith(named + ":")], broken
