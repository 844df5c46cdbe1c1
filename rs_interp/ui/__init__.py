"""The user-facing layer: figures and the command line, on top of the analyses.

- :mod:`.plots`, :mod:`.circuit_figure`, :mod:`.variable_figures`: figures (``plotly`` figures, never shown by
  the library);
- :mod:`.cli`: the ``rs-interp`` command line; :mod:`.circuit_command`: ``rs-interp circuit`` and
  :func:`~.circuit_command.run_circuit`;
- ``_args``, ``_circuit_args``: the command line's argument checks, light so a bad argument is refused before
  torch loads; ``_circuit_choice``: the circuit ``rs-interp circuit`` takes without ``--size``.

Importing this package loads nothing heavy (the command line's ``--help`` answers at once).
"""

from .._lazy import attach

#: Every submodule answers as an attribute (``rs_interp.ui.plots``), imported on first use.
__getattr__, __dir__ = attach(__name__, {}, globals())
