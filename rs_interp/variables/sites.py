"""Where an interchange acts: the hook points the certificate vouches for, and the activation each one
gives the subspace to live in.

A :class:`Site` is a hook point and, at a head's ``hook_z``, a head:

- the residual stream, ``blocks.l.hook_resid_pre`` / ``_mid`` / ``_post`` (width ``d_model``): what every
  later component reads, by the identity ``stream`` (and ``input`` for ``blocks.0.hook_resid_pre``);
- a head's output, ``blocks.l.attn.hook_z`` with ``head=h`` (width ``d_head``; without a head, every
  head's outputs side by side, width ``n_heads * d_head``): the identity ``z`` (it is on the forward path);
- an MLP's neurons, ``blocks.l.mlp.hook_post`` (width ``d_mlp``): ``mlp weights`` (the neurons are what
  ``W_out`` multiplies).

Each helper that intervenes calls ``require(model, helper, also=site.identities)``: a site whose identity
fails on the model is refused by name, and any other hook point is refused with the list of these.

>>> import rs_interp as ri
>>> model = ri.load_toy_model("induction-2l")
>>> site = Site("blocks.1.attn.hook_z", head=0)
>>> site.width(model), site.identities, Site("blocks.1.hook_resid_pre").width(model)
(16, ('z',), 32)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from .. import _names as N
from .._backend import Model
from ..exact.validate import as_int

__all__ = ["Site", "as_site"]

_RESID = re.compile(r"blocks\.(\d+)\.hook_resid_(pre|mid|post)")
_Z = re.compile(r"blocks\.(\d+)\.attn\.hook_z")
_POST = re.compile(r"blocks\.(\d+)\.mlp\.hook_post")


@dataclass(frozen=True)
class Site:
    """A hook point an interchange acts on, and a head at ``hook_z`` (module docstring).

    Raises:
        ValueError: a hook point of no kind listed in the module docstring, or a head given elsewhere than
            ``hook_z``.
    """

    hook: str
    head: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.hook, str) or self.kind is None:
            raise ValueError(f"{self.hook!r} is not a hook point an interchange acts on: one of "
                             "blocks.L.hook_resid_pre / _mid / _post, blocks.L.attn.hook_z (with head=), "
                             "blocks.L.mlp.hook_post")
        if self.head is not None:
            if self.kind != "z":
                raise ValueError(f"head= is for a head's output (blocks.L.attn.hook_z), not {self.hook}")
            object.__setattr__(self, "head", as_int("head", self.head))

    @property
    def kind(self) -> str | None:
        """``"resid"``, ``"z"`` or ``"neurons"`` (None for another hook point)."""
        for kind, pattern in (("resid", _RESID), ("z", _Z), ("neurons", _POST)):
            if isinstance(self.hook, str) and pattern.fullmatch(self.hook):
                return kind
        return None

    @property
    def layer(self) -> int:
        layer = N.layer_of(self.hook)
        assert layer is not None
        return layer

    @property
    def identities(self) -> tuple[str, ...]:
        """The certificate's identities this site relies on (module docstring)."""
        if self.kind == "resid":
            return ("stream", "input") if self.hook == N.RESID0 else ("stream",)
        return ("z",) if self.kind == "z" else ("mlp weights",)

    def check(self, model: Model) -> "Site":
        """This site if ``model`` has its hook point and head.

        Raises:
            ValueError: the model lacks the hook point (an MLP's on an attention-only model, a layer past
                its last) or the head.
        """
        if self.hook not in model.hook_dict or self.layer >= model.cfg.n_layers:
            shape = f"{model.cfg.n_layers} layers" + (", attention-only" if model.cfg.attn_only else "")
            raise ValueError(f"the model has no hook point {self.hook!r} ({shape})")
        if self.head is not None and not 0 <= self.head < model.cfg.n_heads:
            raise ValueError(f"head {self.head} is out of range: layer {self.layer} has {model.cfg.n_heads} heads")
        return self

    def width(self, model: Model) -> int:
        """The width of the activation a basis lives in here (module docstring)."""
        cfg = model.cfg
        if self.kind == "resid":
            return cfg.d_model
        if self.kind == "z":
            return cfg.d_head if self.head is not None else cfg.n_heads * cfg.d_head
        return cfg.d_mlp

    def view(self, act: torch.Tensor) -> torch.Tensor:
        """The site's (batch, pos, width) view of the hook's activation (a head's slice of ``hook_z``, or
        every head's flattened)."""
        if self.kind != "z":
            return act
        return act[:, :, self.head] if self.head is not None else act.flatten(2)

    def replace(self, act: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """The hook's activation with the site's view replaced by ``new`` (batch, pos, width), out of place."""
        if self.kind != "z":
            return new
        if self.head is None:
            return new.reshape(act.shape)
        out = act.clone()
        out[:, :, self.head] = new
        return out


def as_site(site: Site | str | tuple[str, int], model: Model) -> Site:
    """``site`` as a :class:`Site` checked against ``model``: a :class:`Site`, a hook name, or ``(hook name, head)``."""
    if isinstance(site, str):
        site = Site(site)
    elif isinstance(site, tuple) and len(site) == 2:
        site = Site(*site)
    elif not isinstance(site, Site):
        raise ValueError(f"site must be a Site, a hook point's name or (hook name, head), got {type(site).__name__}")
    return site.check(model)
