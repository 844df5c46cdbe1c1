"""High-level causal models: named variables computed from an input and from one another, and the
counterfactual output of a base input with one variable taken from a source input.

A :class:`CausalModel` is a list of :class:`Variable` s in the order they are computed, each a mechanism
of its parents (``"input"`` is the input itself), and the name of the output variable. A variable's
value is any Python value; a *per-position* variable's value is a tuple with one entry per input
position (tracr's RASP variables, an induction sequence's previous tokens), and an intervention may set
one entry of it. The interchange intervention of Geiger et al. (2021) at the high level is then

    counterfactual(base, source, variable, at=(p, q)) = run(base, variable[p] := run(source)[variable][q])[output]

(``at=None``: the whole value is the source's). Every value that follows the variable is computed again
from the changed one; everything else stays the base's. A low-level intervention that makes the model
give this output on many pairs is evidence that the model holds the variable where it intervened.

>>> cm = CausalModel("sum", (Variable("a", ("input",), lambda x: x[0]), Variable("b", ("input",), lambda x: x[1]),
...                         Variable("out", ("a", "b"), lambda a, b: a + b)), output="out")
>>> cm.run((1, 2))["out"], cm.counterfactual((1, 2), (5, 7), "a")
(3, 7)
>>> cm.differing((1, 2), (5, 2))
('a', 'out')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .._messages import few

__all__ = ["Variable", "CausalModel"]


@dataclass(frozen=True)
class Variable:
    """One variable of a :class:`CausalModel`.

    Attributes:
        name: its name (unique in the model; ``"input"`` is reserved for the input).
        parents: the names its mechanism reads, in its arguments' order (earlier variables or ``"input"``).
        mechanism: ``(*parent values) -> value``.
        per_position: whether the value is a tuple with one entry per input position.
        description: what it is, in words.
    """

    name: str
    parents: tuple[str, ...]
    mechanism: Callable[..., Any]
    per_position: bool = False
    description: str = ""


@dataclass(frozen=True)
class CausalModel:
    """A high-level causal model (module docstring).

    Attributes:
        name: the task or program it describes.
        variables: the variables in the order they are computed.
        output: the name of the output variable.

    Raises:
        ValueError: a repeated or reserved name, a parent not computed before, an unknown output.
    """

    name: str
    variables: tuple[Variable, ...]
    output: str

    def __post_init__(self) -> None:
        known = {"input"}
        for v in self.variables:
            if v.name in known:
                raise ValueError(f"{self.name}: the variable name {v.name!r} is used twice (or is the reserved "
                                 f"'input')")
            missing = [p for p in v.parents if p not in known]
            if missing:
                raise ValueError(f"{self.name}: {v.name}'s parents {few(missing)} are not computed before it")
            known.add(v.name)
        if self.output not in known - {"input"}:
            raise ValueError(f"{self.name}: the output {self.output!r} is not one of its variables")

    @property
    def names(self) -> tuple[str, ...]:
        """The variables' names, in order."""
        return tuple(v.name for v in self.variables)

    def variable(self, name: str) -> Variable:
        """The variable ``name``.

        Raises:
            ValueError: no variable has that name (the message lists them).
        """
        for v in self.variables:
            if v.name == name:
                return v
        raise ValueError(f"{self.name} has no variable {name!r}; its variables: {few(self.names, 8)}")

    def descendants(self, name: str) -> set[str]:
        """The variables computed, directly or not, from ``name``."""
        self.variable(name)
        out: set[str] = set()
        for v in self.variables:
            if name in v.parents or out & set(v.parents):
                out.add(v.name)
        return out

    def run(self, x: Any, fixed: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Every variable's value on input ``x`` (and ``"input"``: ``x``), with ``fixed`` values set:
        ``{name: value}`` sets the whole value, ``{name: {position: value}}`` one entry of a per-position one."""
        fixed = dict(fixed or {})
        unknown = set(fixed) - set(self.names)
        if unknown:
            raise ValueError(f"{self.name} has no variable(s) {few(sorted(unknown))} to fix; its variables: "
                             f"{few(self.names, 8)}")
        values: dict[str, Any] = {"input": x}
        for v in self.variables:
            value = v.mechanism(*(values[p] for p in v.parents))
            if v.name in fixed:
                value = _set(v, value, fixed[v.name])
            values[v.name] = value
        return values

    def counterfactual(self, base: Any, source: Any, variable: str, at: tuple[int, int] | None = None) -> Any:
        """The output on ``base`` with ``variable`` taken from ``source``: its entry at base position
        ``at[0]`` set to the source's at ``at[1]`` (a per-position variable), or its whole value (``at=None``)."""
        src = self.run(source)[self.variable(variable).name]
        return self.run(base, {variable: src if at is None else {at[0]: src[at[1]]}})[self.output]

    def differing(self, base: Any, source: Any, at: tuple[int, int] | None = None) -> tuple[str, ...]:
        """The variables whose values differ between ``base`` and ``source`` (per-position ones compared at
        ``at``: the base's entry at ``at[0]`` with the source's at ``at[1]``; whole values without ``at``)."""
        b, s = self.run(base), self.run(source)
        out = []
        for v in self.variables:
            if v.per_position and at is not None:
                same = b[v.name][at[0]] == s[v.name][at[1]]
            else:
                same = b[v.name] == s[v.name]
            if not same:
                out.append(v.name)
        return tuple(out)


def _set(variable: Variable, value: Any, fix: Any) -> Any:
    if not isinstance(fix, Mapping):
        return fix
    if not variable.per_position:
        raise ValueError(f"{variable.name} is not per-position: fix its whole value, not {fix!r}")
    out = list(value)
    for position, entry in fix.items():
        out[position] = entry
    return tuple(out)
