"""The reproduction of the theory: every table of ``rs-interp reproduce``, its expected values, its
report. The library (``rs_interp``) never imports this package; this package reads the library.

- :data:`SECTIONS`: the registry, the one list of sections (the CLI's ``--only`` choices, the report's
  order and the tests all read it). Adding a section is one builder in :mod:`.sections` plus one line here.
- :mod:`.expected`: the theory's values and the accepted bands (one line each).
- :mod:`.context`: rows, sections and the run context; :mod:`.recipes`: the toy models' recipes.
- :mod:`.gpt2_check`, :mod:`.gradients`: the GPT-2 analysis and conversion check, the gradient table.
- :mod:`.report`: the text table, ``results.json`` and ``report.html``.

>>> list(SECTIONS)[:3]
['induction', 'circuits', 'ablation']
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable, Iterable

from .context import Context, Section

__all__ = ["SECTIONS", "builder", "run_sections", "Context", "Section"]

#: name -> ``module:function`` of its builder under :mod:`rs_interp.reproduce.sections`, in report order.
#: A builder returns one :class:`Section` or a list of them (``circuits`` gives three tables).
SECTIONS: dict[str, str] = {
    "induction": "induction:induction_section",
    "circuits": "induction:circuits_section",
    "ablation": "ablation:ablation_section",
    "attribution_patching": "ablation:attribution_patching_section",
    "code_model": "code_model:code_model_section",
    "paths": "theorem3:paths_section",
    "gpt2": "gpt2:gpt2_section",
    "geometry": "geometry:geometry_section",
    "finance": "finance:finance_section",
}


def builder(name: str) -> Callable[[Context], Section | list[Section]]:
    """The builder of section ``name`` (imported on demand: the CLI's ``--help`` stays light)."""
    if name not in SECTIONS:
        raise ValueError(f"unknown section {name!r}; one of {list(SECTIONS)}")
    module, function = SECTIONS[name].split(":")
    return getattr(importlib.import_module(f"{__name__}.sections.{module}"), function)


def run_sections(ctx: Context, only: Iterable[str] | None = None) -> list[Section]:
    """Compute the sections (all, or those named in ``only``), in report order, logging each step."""
    wanted = set(only) if only else set(SECTIONS)
    unknown = wanted - set(SECTIONS)
    if unknown:
        raise ValueError(f"unknown sections {sorted(unknown)}; choose from {list(SECTIONS)}")
    out: list[Section] = []
    for name in SECTIONS:
        if name in wanted:
            ctx.log(f"computing {name}")
            result = builder(name)(ctx)
            out.extend(dataclasses.replace(s, part=name) for s in (result if isinstance(result, list) else [result]))
    return out
