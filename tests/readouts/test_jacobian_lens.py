"""The Jacobian lens's files (issue 62): round trips, the reference's lens file and fit checkpoint, merging slices
into one fit, and TransformerLens 4.3's ``JacobianLens.load`` both ways (4.x; under 3.x the files follow its saver)."""

from __future__ import annotations

import warnings

import pytest
import torch

import rs_interp as ri
from rs_interp import _backend
from rs_interp.readouts.jacobian_basis import in_model_basis, stream_basis
from rs_interp.readouts.jacobian_lens import CENTRED, RAW
from tests.builders import TL4, make_variant
from tests.hf_families import save_checkpoint
from tests.readouts.test_jacobian_fit import random_prompts

needs_tl43 = pytest.mark.skipif(not TL4, reason=f"TransformerLens {_backend.TL_VERSION} has no "
                                "tools.analysis.JacobianLens (4.3's): its loader is tested under 4.x; here the "
                                "files follow its saver")


@pytest.fixture(scope="module")
def fitted():
    model = make_variant("LN", "standard", False, n_layers=3)
    prompts = random_prompts(50, (9, 8, 10, 7))
    return model, ri.fit_jacobian_lens(model, prompts, skip_first=2, corpus="random", progress=False)


def reference_save(path, J, n_prompts, d_model):
    """A lens file as the reference's ``JacobianLens.save`` writes it (jlens/lens.py): four keys, float16."""
    torch.save({"J": {layer: m.to(torch.float16) for layer, m in J.items()}, "n_prompts": n_prompts,
                "source_layers": sorted(J), "d_model": d_model}, path)


def reference_checkpoint(path, sums, n_done, next_idx, target_layer, skip_first):
    """A fit checkpoint as the reference's ``fit`` writes it (jlens/fitting.py's ``write_checkpoint``): six keys."""
    torch.save({"jacobian_sum": sums, "n_done": n_done, "next_idx": next_idx, "source_layers": sorted(sums),
                "target_layer": target_layer, "skip_first": skip_first}, path)


def test_a_file_round_trips(fitted, tmp_path):
    _, lens = fitted
    back = ri.JacobianLens.load(lens.save(tmp_path / "lens.pt"))
    assert torch.equal(back.jacobians, lens.jacobians.half().float())  # float16 by default, as the reference
    assert (back.source_layers, back.n_prompts, back.basis) == (lens.source_layers, 4, RAW)
    assert back.metadata == lens.metadata
    exact = ri.JacobianLens.load(lens.save(tmp_path / "lens64.pt", dtype=torch.float64))
    assert torch.equal(exact.jacobians, lens.jacobians)
    raw = torch.load(tmp_path / "lens.pt", weights_only=True)
    assert set(raw) == {"J", "n_prompts", "source_layers", "d_model", "metadata"} and raw["J"][0].dtype == torch.float16


def test_the_reference_files_load(tmp_path):
    J = {0: torch.randn(8, 8), 2: torch.randn(8, 8)}
    reference_save(tmp_path / "ref.pt", J, 5, 8)
    lens = ri.JacobianLens.load(tmp_path / "ref.pt")
    assert lens.source_layers == (0, 2) and lens.n_prompts == 5 and lens.metadata == {} and lens.basis == RAW
    assert torch.equal(lens.matrix(2), J[2].half().float())
    reference_checkpoint(tmp_path / "ckpt.pt", {l: 3 * m for l, m in J.items()}, 3, 4, 3, 16)
    lens = ri.JacobianLens.load(tmp_path / "ckpt.pt")
    assert lens.n_prompts == 3 and lens.metadata["target_layer"] == 3
    assert torch.allclose(lens.matrix(0), J[0], atol=1e-6)
    torch.save({"jacobian_sum": {0: J[0]}, "n_done": 0, "next_idx": 0}, tmp_path / "empty.pt")
    with pytest.raises(ri.FileError, match="no prompt done"):
        ri.JacobianLens.load(tmp_path / "empty.pt")
    torch.save({"weights": 1}, tmp_path / "other.pt")
    with pytest.raises(ri.FileError, match="other.pt is neither a lens"):
        ri.JacobianLens.load(tmp_path / "other.pt")
    torch.save({"J": {0: torch.zeros(8, 8), 1: torch.zeros(8, 7)}, "n_prompts": 1, "d_model": 8}, tmp_path / "bad.pt")
    with pytest.raises(ri.FileError, match=r"tensor 'J\[1\]' has shape \(8, 7\), not \(8, 8\)"):
        ri.JacobianLens.load(tmp_path / "bad.pt")


def test_merge_of_slices_is_one_fit(fitted):
    model, whole = fitted
    prompts = random_prompts(50, (9, 8, 10, 7))
    parts = [ri.fit_jacobian_lens(model, p, skip_first=2, corpus="random", progress=False)
             for p in (prompts[:1], prompts[1:])]
    merged = ri.JacobianLens.merge(parts)
    assert merged.n_prompts == 4 and merged.metadata == whole.metadata
    assert (merged.jacobians - whole.jacobians).abs().max() <= 1e-13 * whole.jacobians.abs().max()
    other = ri.fit_jacobian_lens(model, prompts[:1], skip_first=3, corpus="random", progress=False)
    with pytest.raises(ValueError, match="provenance"):
        ri.JacobianLens.merge([parts[0], other])
    with pytest.raises(ValueError, match="at least one"):
        ri.JacobianLens.merge([])


@needs_tl43
def test_transformer_lens_reads_what_rs_interp_writes(fitted, tmp_path):
    from transformer_lens.tools.analysis import JacobianLens as TLLens

    _, lens = fitted
    theirs = TLLens.load(str(lens.save(tmp_path / "lens.pt")))
    assert theirs.source_layers == list(lens.source_layers) and theirs.n_prompts == 4 and theirs.d_model == 16
    assert all(torch.equal(theirs.jacobians[l], lens.matrix(l).half().float()) for l in lens.source_layers)
    assert theirs.metadata == lens.metadata
    ckpt = tmp_path / "fit.ckpt"
    ri.fit_jacobian_lens(fitted[0], random_prompts(50, (9, 8, 10, 7)), skip_first=2, corpus="random", checkpoint=ckpt,
                         progress=False)
    from_ckpt = TLLens.load(str(ckpt))
    assert from_ckpt.n_prompts == 4
    assert all((from_ckpt.jacobians[l] - lens.matrix(l).float()).abs().max() <= 1e-6 for l in lens.source_layers)


@needs_tl43
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_rs_interp_reads_what_transformer_lens_saves(tmp_path, dtype):
    """Files written by TransformerLens 4.3's own ``JacobianLens.save`` (its fit's provenance, its fp16 default and
    float32): the matrices as stored, bit for bit; the counts and provenance kept; the raw basis read off the
    provenance; a merge of two of its files is their prompt-weighted mean; a file of its cut short is refused by
    name."""
    from transformer_lens.tools.analysis import JacobianLens as TLLens

    g = torch.Generator().manual_seed(3)
    meta = {"model_name": "m", "transformer_lens_fit": True, "corpus": "c", "target_layer": 3,
            "processing": {"compatibility_mode": False, "weight_basis": "raw_huggingface"}}
    parts = []
    for i, n in enumerate((3, 5)):
        J = {0: torch.randn(16, 16, generator=g), 2: torch.randn(16, 16, generator=g)}
        TLLens(J, n_prompts=n, d_model=16, metadata=meta | {"n_prompts": n}).save(str(tmp_path / f"{i}.pt"),
                                                                                  dtype=dtype)
        ours = ri.JacobianLens.load(tmp_path / f"{i}.pt")
        assert ours.source_layers == (0, 2) and ours.n_prompts == n and ours.basis == RAW
        assert ours.metadata == meta | {"n_prompts": n}
        assert all(torch.equal(ours.matrix(l), J[l].to(dtype).float()) for l in J)
        parts.append(ours)
    merged = ri.JacobianLens.merge(parts)
    want = (3 * parts[0].jacobians.double() + 5 * parts[1].jacobians.double()) / 8
    assert merged.n_prompts == 8 and (merged.jacobians.double() - want).abs().max() <= 1e-6 * want.abs().max()
    theirs = TLLens.merge([TLLens.load(str(tmp_path / f"{i}.pt")) for i in range(2)])
    assert all((merged.matrix(l).double() - theirs.jacobians[l].double()).abs().max() <= 1e-6 * want.abs().max()
               for l in (0, 2))
    data = (tmp_path / "0.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ri.FileError, match=r"cut\.pt"):
        ri.JacobianLens.load(tmp_path / "cut.pt")


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2")
    save_checkpoint("gpt2", folder)
    return folder


def _text(n, seed):
    g = torch.Generator().manual_seed(seed)
    return " ".join(f"t{int(i)}" for i in torch.randint(1, 299, (n,), generator=g))


@pytest.mark.slow
@needs_tl43
def test_rs_interp_reads_what_transformer_lens_writes(gpt2_dir, tmp_path):
    """TransformerLens 4.3 fits on its raw bridge and saves; rs_interp loads the file, finds its own fit of the same
    checkpoint (float32 rounding apart), reads it on the raw model as TransformerLens does and maps it exactly onto
    the processed (centred) model."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformer_lens.tools.analysis import JacobianLens as TLLens

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge = TransformerBridge.boot_transformers(str(gpt2_dir), device="cpu")
    bridge.eval()
    prompts = [_text(12, s) for s in range(3)]
    TLLens.fit(bridge, prompts, corpus="t", skip_first_positions=4, show_progress=False).save(str(tmp_path / "tl.pt"))
    theirs = ri.JacobianLens.load(tmp_path / "tl.pt")
    assert theirs.basis == RAW and theirs.metadata["transformer_lens_fit"] is True
    raw = ri.load_pretrained(gpt2_dir, fold_ln=False)
    ours = ri.fit_jacobian_lens(raw, prompts, skip_first=4, progress=False)
    assert (ours.jacobians - theirs.jacobians).abs().max() <= 2e-3 * ours.jacobians.abs().max()  # their float16 file
    readout = TLLens.load(str(tmp_path / "tl.pt")).readout(bridge, prompts[0], top_k=3)
    mine = ri.jacobian_lens(raw, raw.to_tokens(prompts[0]), theirs, k=3)
    theirs_top = torch.stack([readout.lens_topk_indices[l] for l in theirs.source_layers])
    assert torch.equal(mine.top_tokens[1:-1, 0], theirs_top)
    processed = ri.load_pretrained(gpt2_dir)  # fold_ln, center_writing_weights, center_unembed
    assert stream_basis(processed) == CENTRED
    own = ri.fit_jacobian_lens(processed, prompts, skip_first=4, progress=False)
    mapped = in_model_basis(ours, processed, "test")
    assert (mapped - own.jacobians).abs().max() <= 1e-4 * own.jacobians.abs().max()


# --- bases and refusals ------------------------------------------------------------------------------------------
