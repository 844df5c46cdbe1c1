"""Head analyses: what each attention head does, scored and ablated.

- :mod:`.roles`: previous-token, induction and positional scores, attention sinks, Proposition 5;
- :mod:`.composition`: Q-, K- and V-composition scores; :mod:`.copying`: copying scores of the OV circuits;
- :mod:`.ablation`: a layer's key or query input restricted to chosen heads;
- :mod:`.head_ablation`: zero, mean and resample ablation of heads, and whole-model scans.

``rs_interp.heads.<name>`` keeps naming the head-role scores (:mod:`.roles`' public names).
"""

from .._lazy import attach
from .roles import *  # noqa: F403  (the head-role scores, as rs_interp.heads named them before the package)
from .roles import __all__  # noqa: F401  (one list: roles' own)

#: Every submodule answers as an attribute (``rs_interp.heads.composition``), imported on first use.
__getattr__, __dir__ = attach(__name__, {}, globals())
