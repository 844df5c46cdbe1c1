"""The exact core: what every helper relies on, measured on the model in hand, and what the helpers share
to stay exact.

- :mod:`rs_interp.exact.certificate`: :func:`~rs_interp.exact.certificate.certify` measures every identity
  of ``IDENTITIES`` on a model; ``require`` refuses a helper, by name, where one it needs fails.
- :mod:`rs_interp.exact.needs`: what each public helper relies on (``NEEDS``), or why it is exempt (data only).
- ``_checks``, ``_runs`` and ``_layer_runs``: the identities read off the clean probe run, and those that need runs of
  their own (gradients, rows, start and stop at a layer); ``_fingerprint``: the certificate's cache key.
- :mod:`rs_interp.exact.norm`: the one norm (apply, frozen scale, affine with the backend's gain convention,
  input gradient).
- :mod:`rs_interp.exact.readout`: the readout of the logits (final norm, unembedding, soft-cap, output vocabulary).
- :mod:`rs_interp.exact.stream`: the stream's readers and senders, and their gradients.
- :mod:`rs_interp.exact.validate`: the arguments every helper checks (tokens, targets, ablations, weights).
"""

from .._lazy import attach

#: Every submodule answers as an attribute (``rs_interp.exact.needs``), imported on first use.
__getattr__, __dir__ = attach(__name__, {}, globals())
