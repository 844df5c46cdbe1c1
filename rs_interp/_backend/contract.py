"""The backend's contract: what each TransformerLens version's module (:mod:`.tl3`, :mod:`.tl4`) provides.

The package picks one of the two at import and reads it only through these members
(:mod:`rs_interp._backend`); each version's module implements every one with the same signature, as
written here (a module satisfies a :class:`typing.Protocol` by the names it exports, PEP 544: neither
version's module has an ``__all__`` that leaves one out; mypy accepts ``_impl: Backend``). A version may
annotate a parameter ``Any`` where the contract names a type (it accepts more); nothing else may differ.
``tests/_backend/test_contract.py`` holds both versions to it from their sources (and the installed one
as imported), and the package to reading nothing else.

Each version's module also binds its model and config classes (``HookedTransformer``, ``TransformerBridge``
...) as :data:`CLASSES` name them, the names its signatures and these use. They stand apart from the
protocol's members: a class attribute ``Model`` would shadow the type its methods' annotations name.

>>> import rs_interp._backend as backend
>>> isinstance(backend._impl, Backend)
True
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol, Sequence, TypeAlias, runtime_checkable

if TYPE_CHECKING:
    import torch

    from . import head_copies

    Model: TypeAlias = Any  # either version's class (CLASSES)
    ModelConfig: TypeAlias = Any

__all__ = ["Backend", "CLASSES"]

#: The classes each version's module binds beside :class:`Backend`'s functions.
CLASSES = ("Model", "ModelConfig")


@runtime_checkable
class Backend(Protocol):
    """One TransformerLens version's module, as the package reads it (the module docstring)."""

    # --- the model and its config
    def config_fields(self) -> frozenset[str]:
        """The field names the version's config accepts."""

    def make_config(self, **fields: Any) -> ModelConfig:
        """The version's config from ``fields`` (the caller has checked the names)."""

    def build_model(self, cfg: ModelConfig) -> Model:
        """A fresh model of ``cfg``, its weights drawn from the global RNG."""

    def reinitialise(self, model: Model) -> None:
        """Draw ``model``'s weights again from the global RNG, as :meth:`build_model` does."""

    def portable_state(self, model: Model) -> dict[str, torch.Tensor]:
        """The parameters under ``HookedTransformer``'s names and shapes (no buffers)."""

    def load_portable_state(self, model: Model, state: dict[str, torch.Tensor]) -> None:
        """Load a portable state dict (buffers optional) in place; ValueError naming missing parameters."""

    def is_hf_booted(self, model: Model) -> bool:
        """Whether ``model`` runs Hugging Face's modules (it cannot be rebuilt from its config)."""

    def converted_copy(self, model: Model, dtype: torch.dtype) -> Model:
        """A copy of a Hugging Face-booted ``model`` in ``dtype``."""

    def model_source(self, model: Model) -> str:
        """Whose modules ``model`` runs: ``"native"`` or Hugging Face's."""

    # --- loading
    def gpt2_from_hf_dir(self, path: str, cfg: ModelConfig, *, fold_ln: bool, center_writing_weights: bool,
                         center_unembed: bool, dtype: torch.dtype) -> Model:
        """GPT-2 from a local Hugging Face directory, processed as asked."""

    def gpt2_from_hub(self, name: str, *, fold_ln: bool, center_writing_weights: bool, center_unembed: bool,
                      dtype: torch.dtype) -> Model:
        """GPT-2 from the hub, processed as asked."""

    def from_hf(self, source: str, *, fold_ln: bool, center_writing_weights: bool, center_unembed: bool,
                dtype: torch.dtype) -> Model:
        """A Hugging Face model from a local directory or a hub name."""

    def set_tokenizer(self, model: Model, tokenizer: Any) -> None:
        """Give ``model`` ``tokenizer``."""

    def set_unembedding(self, model: Model, W_U: torch.Tensor) -> None:
        """Copy ``W_U`` (d_model, d_vocab) into the unembedding."""

    def other_version(self) -> str:
        """What to try when this version cannot load a family: the other version, and how."""

    # --- running
    def run_from_layer(self, model: Model, x: torch.Tensor, start: int) -> torch.Tensor:
        """The logits from the stream ``x`` entering block ``start``."""

    def run_to(self, model: Model, x: torch.Tensor, stop: int, **kwargs: Any) -> torch.Tensor:
        """The stream before block ``stop`` (after the last for ``n_layers``)."""

    def logits_with_grad(self, model: Model, tokens: torch.Tensor) -> torch.Tensor:
        """``model(tokens)``'s logits, with gradients."""

    @contextlib.contextmanager
    def unembed_stored_transposed(self, model: Model) -> Iterator[None]:
        """``W_U`` stored so that the unembedding copies nothing per call, for the duration (the same values and
        logits; restored after): 3.x's copies ``W_U.T`` at every call, 4.x's nothing to do."""

    def is_own_hook(self, fn: Callable) -> bool:
        """Whether a PyTorch hook is the version's own wiring rather than a user's."""

    # --- attention
    @contextlib.contextmanager
    def per_head_inputs(self, model: Model, fwd: Sequence[tuple[Any, Callable]]
                        ) -> Iterator[list[tuple[Any, Callable]]]:
        """The per-head query, key and value inputs on for the block (switched on and restored, or emulated)."""

    def spanning_norms(self, model: Model) -> list[head_copies.SpanningNorm]:
        """The query and key norms that span the heads, each with the projection it follows."""

    @contextlib.contextmanager
    def seen_head_inputs(self, model: Model, box: dict) -> Iterator[None]:
        """Record in ``box`` each spanning layer's query and key inputs, (batch, pos, head, d_model)."""

    def projection_layers(self, model: Model) -> set[int]:
        """The layers whose ``hook_{q,k,v}`` hold ``ln1(resid_pre) W + b`` per head."""

    def score_hooks(self, model: Model, layer: int, box: dict[str, torch.Tensor], key: str
                    ) -> list[tuple[str, Callable]]:
        """Hooks that store the layer's pre-softmax scores (batch, head, query, key) in ``box[key]``."""

    def apply_rotary(self, model: Model, layer: int, x: torch.Tensor) -> torch.Tensor:
        """The layer's rotary embedding applied to ``x`` (batch, pos, head, d_head)."""

    def attn_scale(self, model: Model, layer: int) -> float:
        """The layer's ``attn_scale``."""

    def attention_output(self, model: Model, layer: int, x: torch.Tensor) -> torch.Tensor:
        """The layer's attention with ``x`` as query, key and value input."""

    def pattern_after_attention(self, model: Model, layer: int) -> bool:
        """Whether an edit at ``attn.hook_pattern`` is discarded."""

    def bias_parameters(self, model: Model, names: Sequence[str]) -> list[torch.nn.Parameter]:
        """Every parameter whose leaf name is in ``names``."""

    # --- MLPs and norms
    def mlp_out_parameter(self, model: Model, layer: int) -> torch.nn.Parameter:
        """The parameter holding the layer's ``W_out``."""

    def mlp_modules(self, model: Model, layer: int) -> tuple[torch.nn.Module, torch.nn.Module]:
        """The modules an MLP's input and own output are read at."""

    def norm_affine(self, model: Model, norm: torch.nn.Module
                    ) -> tuple[str | None, torch.Tensor | None, torch.Tensor | None, float]:
        """``(kind, gain, bias, eps)`` of one of the model's norms as it computes."""

    def post_norm_architectures(self) -> frozenset[str]:
        """The architectures whose conversion keeps the norms after the sublayers at ``ln1``/``ln2``."""
