"""Names of a package imported on first use (PEP 562), so that importing the package stays light.

``import rs_interp`` (and the ``rs-interp`` command's ``--help``) loads neither torch nor
TransformerLens; a notebook pays for what it uses. A package lists each public name with the module
that defines it and takes its ``__getattr__`` and ``__dir__`` from :func:`attach`.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any, Callable, Mapping


def attach(package: str, where: Mapping[str, str], namespace: dict[str, Any],
           moved: Mapping[str, str] | None = None,
           deprecated: Mapping[str, tuple[str, type[Warning]]] | None = None,
           ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``where`` maps a public name to its module (relative
    to ``package``); ``moved`` maps a submodule's old name to the module it now is (``from rs_interp
    import plots`` after ``plots`` moved into ``rs_interp.ui``); ``deprecated`` maps an old public name
    to ``(its new place, the warning)``: the object at the new place (``"rs_interp.models.Trained"``),
    with the warning naming that place, on every use, and never in ``__all__`` or ``dir()``; any other
    name is tried as a submodule (``rs_interp.circuits``). A loaded name is stored in ``namespace`` (the
    package's globals), so each is imported once (a deprecated one never is: it warns each time).

    >>> import json.decoder
    >>> namespace = {}
    >>> getattr_, dir_ = attach("json", {"JSONDecoder": ".decoder"}, namespace)
    >>> getattr_("JSONDecoder") is json.decoder.JSONDecoder, list(namespace)
    (True, ['JSONDecoder'])
    >>> getattr_, _ = attach("json", {}, {}, moved={"parser": ".decoder"})
    >>> getattr_("parser") is json.decoder
    True
    >>> getattr_("nothing")
    Traceback (most recent call last):
    AttributeError: module 'json' has no attribute 'nothing'
    >>> import warnings
    >>> old = {"Decoder": ("json.decoder.JSONDecoder", DeprecationWarning)}
    >>> getattr_, dir_ = attach("json", {}, {}, deprecated=old)
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     getattr_("Decoder") is json.decoder.JSONDecoder, str(caught[0].message), dir_()
    (True, 'json.Decoder is now json.decoder.JSONDecoder: the old name goes in a later release', [])
    """

    moved = moved or {}
    deprecated = deprecated or {}

    def __getattr__(name: str) -> Any:
        if name in deprecated:
            new, category = deprecated[name]
            module, _, attr = new.rpartition(".")
            warnings.warn(f"{package}.{name} is now {new}: the old name goes in a later release", category,
                          stacklevel=2)
            return getattr(importlib.import_module(module), attr)
        if name not in moved and name not in where and ("__path__" not in namespace or name.startswith("__")):
            # a module has no submodules; a dunder (__all__, __wrapped__ ...) is never one
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = moved.get(name) or where.get(name, "." + name)
        with warnings.catch_warnings():
            # TransformerLens imports huggingface_hub, which imports tqdm.auto: in a Jupyter kernel without
            # ipywidgets that warns "IProgress not found" before any bar is asked for (rs_interp's own
            # bars pick the text bar where there are no widgets: rs_interp._progress).
            warnings.filterwarnings("ignore", message="IProgress not found")
            try:
                loaded = importlib.import_module(module, package)
            except ModuleNotFoundError as err:
                if err.name != f"{package}{module}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = loaded if name in moved or name not in where or module == "." + name else getattr(loaded, name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(namespace.get("__all__", ())))

    return __getattr__, __dir__
