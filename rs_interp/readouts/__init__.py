"""Readouts of the logits: what the residual stream says about the output, split exactly.

- :mod:`.attribution`: first-order direct logit attribution (each token's final-norm scale frozen);
- :mod:`.second_order`: attribution over paths source -> head -> logit, on models with norms and MLPs;
- :mod:`.paths`: Theorem 3's exact path expansion of attention-only logits, and its attribution to paths;
- :mod:`.lens`: the logit lens; :mod:`.tuned_lens`: the tuned lens (a learned translator per reading point).

The public names are ``rs_interp``'s (``rs_interp.logit_lens``, ...); importing this package loads nothing heavy.
"""

from .._lazy import attach

#: Every submodule answers as an attribute (``rs_interp.readouts.lens``), imported on first use.
__getattr__, __dir__ = attach(__name__, {}, globals())
