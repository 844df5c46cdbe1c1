"""Head analyses: what each attention head does, scored and ablated.

- :mod:`.roles`: previous-token, induction and positional scores, attention sinks, Proposition 5;
- :mod:`.composition`: Q-, K- and V-composition scores; :mod:`.copying`: copying scores of the OV circuits;
- :mod:`.ablation`: a layer's key or query input restricted to chosen heads;
- :mod:`.head_ablation`: zero, mean and resample ablation of heads, and whole-model scans.

``rs_interp.heads.<name>`` keeps naming the head-role scores (:mod:`.roles`' public names), and names the
result types of the other analyses (``rs_interp.heads.CompositionScores``).
"""

from typing import TYPE_CHECKING

from .._lazy import attach
from .roles import *  # noqa: F403  (the head-role scores, as rs_interp.heads named them before the package)
from .roles import __all__ as _ROLES

#: The result types public here only, each with its module, imported on first use (rs_interp._lazy).
_WHERE = {"CompositionScores": ".composition", "HeadAffinity": ".affinity", "HeadAblationScan": ".head_ablation"}

if TYPE_CHECKING:  # for type checkers and the documentation
    from .affinity import HeadAffinity
    from .composition import CompositionScores
    from .head_ablation import HeadAblationScan

__all__ = [*_ROLES, "CompositionScores", "HeadAffinity", "HeadAblationScan"]  # noqa: PLE0604

#: Every submodule answers as an attribute (``rs_interp.heads.composition``), imported on first use.
__getattr__, __dir__ = attach(__name__, _WHERE, globals())
