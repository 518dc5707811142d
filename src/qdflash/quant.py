"""Shared INT4/INT8 weight-only quantization: llmcompressor PTQ, fake quantization on a frozen grid, and
exact packing to compressed-tensors ``pack-quantized`` checkpoints.

Grid convention: symmetric per-group, integers in ``[-2^(b-1), 2^(b-1)-1]`` ([-8, 7] for INT4), ``w = q * scale``.
The scales are whatever llmcompressor's observer/GPTQ chose; QAD keeps them frozen and packs the trained
weights onto exactly that grid (``pack_checkpoint``), never re-quantizing.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Iterable

import torch
from torch import nn

from .config import LATENT_INITS
from .runio import library_output_to_log


def qrange(bits: int) -> tuple[int, int]:
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def quantize_ints(w: torch.Tensor, scale: torch.Tensor, group: int, bits: int = 4) -> torch.Tensor:
    """Integer codes of ``w`` [out, in] on the grid ``scale`` [out, in/group]."""
    out_f, in_f = w.shape
    lo, hi = qrange(bits)
    q = torch.round(w.reshape(out_f, in_f // group, group) / scale.unsqueeze(-1).to(w.dtype)).clamp(lo, hi)
    return q.reshape(out_f, in_f)


def dequantize(q: torch.Tensor, scale: torch.Tensor, group: int) -> torch.Tensor:
    out_f, in_f = q.shape
    return (q.reshape(out_f, in_f // group, group) * scale.unsqueeze(-1)).reshape(out_f, in_f)


def fake_quant(w: torch.Tensor, scale: torch.Tensor, group: int, bits: int = 4) -> torch.Tensor:
    """Quantize-dequantize with a straight-through estimator (identity gradient)."""
    wq = dequantize(quantize_ints(w, scale, group, bits), scale.to(w.dtype), group)
    return w + (wq - w).detach()


def absmax_scale(w: torch.Tensor, group: int, bits: int) -> torch.Tensor:
    """RTN symmetric scale absmax / qmax (the convention of the nota drafter GPTQ, full [-8, 7] range)."""
    out_f, in_f = w.shape
    amax = w.detach().reshape(out_f, in_f // group, group).abs().amax(-1)
    return (amax / qrange(bits)[1]).clamp_min(1e-8)


def fake_quant_learned_scale(w: torch.Tensor, scale: torch.Tensor, group: int, bits: int = 4) -> torch.Tensor:
    """Quantize-dequantize with a trainable scale (LSQ / EfficientQAT-style): ``round`` passes gradients straight
    through, ``clamp`` stops them outside the range, so both ``w`` and ``scale`` get gradients. Forward value equals
    ``dequantize(quantize_ints(w, scale))`` exactly."""
    out_f, in_f = w.shape
    lo, hi = qrange(bits)
    s = scale.unsqueeze(-1)
    x = w.reshape(out_f, in_f // group, group) / s
    q = (x + (torch.round(x) - x).detach()).clamp(lo, hi)
    return (q * s).reshape(out_f, in_f)


class FakeQuantLinear(nn.Linear):
    """``nn.Linear`` whose forward uses the weight fake-quantized on a per-group grid (STE).

    The grid is frozen (``weight_scale`` a buffer, the paper's parametrisation) unless ``learn_scale``, in which case
    ``weight_scale`` is a trainable parameter. Latents and scales stay fp32 whatever the compute dtype: the integer
    codes are computed by ``quantize_ints`` in fp32 for the forward, the packing and the dense twin alike."""

    def __init__(self, in_features: int, out_features: int, bias: bool, scale: torch.Tensor, group: int,
                 bits: int = 4, device=None, dtype=None, learn_scale: bool = False,
                 scale_dtype: torch.dtype = torch.float32):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        if in_features % group:
            raise ValueError(f"in_features {in_features} is not a multiple of group size {group}")
        self.group, self.bits, self.learn_scale, self.scale_dtype = group, bits, learn_scale, scale_dtype
        sc = scale.detach().clone().to(device=device, dtype=scale_dtype).to(torch.float32)
        if learn_scale:
            self.weight_scale = nn.Parameter(sc)
        else:
            self.register_buffer("weight_scale", sc, persistent=False)

    @classmethod
    def from_linear(cls, lin: nn.Linear, scale: torch.Tensor, group: int, bits: int = 4,
                    learn_scale: bool = False, scale_dtype: torch.dtype = torch.float32) -> "FakeQuantLinear":
        new = cls(lin.in_features, lin.out_features, lin.bias is not None, scale, group, bits,
                  device=lin.weight.device, dtype=lin.weight.dtype, learn_scale=learn_scale, scale_dtype=scale_dtype)
        new.weight = lin.weight
        if lin.bias is not None:
            new.bias = lin.bias
        return new

    def grid_scale(self) -> torch.Tensor:
        """The scales as served: rounded to ``scale_dtype`` (a bf16 checkpoint is loaded with bf16 scales, so a grid
        that is not bf16-exact would not be the grid that runs); a learned scale keeps its fp32 master value and
        passes its gradient straight through the rounding."""
        s = self.weight_scale.float()
        if self.scale_dtype == torch.float32:
            return s
        return s.detach().to(self.scale_dtype).float() + (s - s.detach())   # value exact, gradient to s

    def codes(self) -> torch.Tensor:
        """The integer codes of the current latents on the current grid (fp32 arithmetic)."""
        return quantize_ints(self.weight.detach().float(), self.grid_scale().detach(), self.group, self.bits)

    def quantized_weight(self) -> torch.Tensor:
        w = self.weight.float()
        if self.learn_scale:
            return fake_quant_learned_scale(w, self.grid_scale(), self.group, self.bits)
        return fake_quant(w, self.grid_scale(), self.group, self.bits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.quantized_weight()
        if torch.is_autocast_enabled(x.device.type):
            return nn.functional.linear(x, w, self.bias)       # autocast casts the fp32 on-grid weight once
        return nn.functional.linear(x, w.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))


def module_matches(name: str, targets: Iterable[str]) -> bool:
    return any(name.endswith(t) or (t.startswith("re:") and re.match(t[3:], name)) for t in targets)


def apply_fake_quant(model: nn.Module, scales: dict[str, torch.Tensor], group: int, bits: int = 4,
                     learn_scale: bool = False, scale_dtype: torch.dtype = torch.float32) -> list[str]:
    """Swap every ``nn.Linear`` named in ``scales`` for a FakeQuantLinear on that grid; returns the names."""
    done = []
    for name, mod in list(model.named_modules()):
        if name in scales and isinstance(mod, nn.Linear) and not isinstance(mod, FakeQuantLinear):
            parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            setattr(parent, name.rsplit(".", 1)[-1],
                    FakeQuantLinear.from_linear(mod, scales[name], group, bits, learn_scale, scale_dtype))
            done.append(name)
    missing = sorted(set(scales) - set(done))
    if missing:
        raise KeyError(f"quantized modules not found in the model: {missing[:5]}...")
    return done


# ----------------------------------------------------------------------------------------------- llmcompressor
def scheme(targets: Iterable[str], bits: int, group: int):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    return QuantizationScheme(targets=list(targets), weights=QuantizationArgs(
        num_bits=bits, type="int", symmetric=True, strategy="group", group_size=group))


def target_regex(suffixes: Iterable[str]) -> str:
    return "re:.*(" + "|".join(re.escape(s) for s in suffixes) + ")$"


def quantize_ptq(model_dir: str, method: str, group: int, suffixes: Iterable[str], calib: list[list[int]],
            out_dir: str | Path, dampening: float = 0.01, bits: int = 4, max_seq_len: int = 2048) -> Path:
    """RTN or GPTQ W{bits}A16 of a causal LM with llmcompressor, saved as compressed-tensors pack-quantized.

    Calibration order is fixed (``shuffle_calibration_samples=False``), so reruns are bit-identical.
    """
    import datasets
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir = Path(out_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    groups = {"group_0": scheme([target_regex(suffixes)], bits, group)}
    if method not in ("rtn", "gptq"):
        raise ValueError(f"unknown PTQ method {method!r} (rtn or gptq)")
    if method == "gptq" and not calib:
        raise ValueError("GPTQ needs calibration sequences")
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with library_output_to_log():                # llmcompressor's calibration and compression bars
        if method == "rtn":
            oneshot(model=model, recipe=QuantizationModifier(config_groups=groups, ignore=["lm_head"]))
        else:
            ds = datasets.Dataset.from_dict({"input_ids": [c[:max_seq_len] for c in calib],
                                             "attention_mask": [[1] * len(c[:max_seq_len]) for c in calib]})
            oneshot(model=model, dataset=ds, recipe=GPTQModifier(config_groups=groups, ignore=["lm_head"],
                                                                 dampening_frac=dampening),
                    num_calibration_samples=len(calib), max_seq_length=max_seq_len, shuffle_calibration_samples=False)
        model.save_pretrained(tmp, save_compressed=True)
    tok.save_pretrained(tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


# ----------------------------------------------------------------------------------------------- pack / unpack
def load_state(ckpt: str | Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    files = sorted(Path(ckpt).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {ckpt}")
    state = {}
    for f in files:
        try:
            state.update(load_file(f))
        except Exception as e:  # truncated / corrupt file
            raise ValueError(f"cannot read checkpoint file {f} (corrupt or incomplete?): {e}") from e
    return state


def read_grid(ckpt: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int, int]:
    """Integer codes and scales of every packed Linear in a compressed-tensors checkpoint.

    Returns (ints by module name, scales by module name, group size, bits)."""
    from compressed_tensors.compressors import unpack_from_int32
    cfg = json.loads((Path(ckpt) / "config.json").read_text())
    qc = cfg.get("quantization_config")
    if not qc:
        raise ValueError(f"{ckpt} is not a compressed-tensors checkpoint (no quantization_config)")
    w = next(iter(qc["config_groups"].values()))["weights"]
    group, bits = int(w["group_size"]), int(w["num_bits"])
    state = load_state(ckpt)
    ints, scales = {}, {}
    for k, v in state.items():
        if k.endswith(".weight_packed"):
            name = k[: -len(".weight_packed")]
            shape = torch.Size(state[name + ".weight_shape"].tolist())
            ints[name] = unpack_from_int32(v, bits, shape).to(torch.int8)
            scales[name] = state[name + ".weight_scale"].to(torch.float32)
    return ints, scales, group, bits


def packed_tensors(name: str, q: torch.Tensor, scale: torch.Tensor, bits: int) -> dict[str, torch.Tensor]:
    """compressed-tensors ``pack-quantized`` entries of one Linear from its integer codes and scales."""
    from compressed_tensors.compressors import pack_to_int32
    return {name + ".weight_packed": pack_to_int32(q.to(torch.int8), bits).contiguous(),
            name + ".weight_scale": scale.detach().clone().contiguous(),
            name + ".weight_shape": torch.tensor(list(q.shape), dtype=torch.int64)}


def pack_checkpoint(model: nn.Module, template_ckpt: str | Path, out_dir: str | Path) -> Path:
    """Write ``model`` (FakeQuantLinear on the template's grid) as a pack-quantized checkpoint.

    Quantized weights are stored as the exact integer codes of the fake-quant forward with the template's scales;
    everything else dense. ``config.json`` (with its quantization_config) and tokenizer files come from the
    template, so the result loads in transformers and vLLM like the PTQ checkpoint it started from.
    """
    from safetensors.torch import save_file
    template_ckpt, out_dir = Path(template_ckpt), Path(out_dir)
    _, t_scales, group, bits = read_grid(template_ckpt)
    t_dtypes = {k[: -len(".weight_scale")]: v.dtype for k, v in load_state(template_ckpt).items()
                if k.endswith(".weight_scale")}
    fq = {n: m for n, m in model.named_modules() if isinstance(m, FakeQuantLinear)}
    if set(fq) != set(t_scales):
        raise ValueError(f"quantized modules differ from the template: {sorted(set(fq) ^ set(t_scales))[:5]}")
    state = {}
    for k, v in model.state_dict().items():
        mod = k.rsplit(".", 1)[0]
        if mod in fq and k.endswith(".weight"):
            m = fq[mod]
            sc = m.grid_scale().detach().cpu()
            if not m.learn_scale and not torch.equal(sc, t_scales[mod].to(m.scale_dtype).float()):
                raise ValueError(f"{mod}: its grid moved away from the template's (scales differ)")
            state.update(packed_tensors(mod, m.codes().cpu(), sc.to(t_dtypes[mod]), bits))
        elif not (mod in fq and k.endswith(".weight_scale")):     # a learned scale is packed above, as served
            state[k] = v.detach().cpu().contiguous()
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
    for f in template_ckpt.iterdir():
        if f.suffix in (".json", ".jinja", ".txt", ".model") and f.name != "model.safetensors.index.json":
            shutil.copy(f, tmp / f.name)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


def load_fake_quant_model(ckpt: str | Path, base_dir: str | Path, dtype: torch.dtype = torch.float32,
                          latent_init: str = "grid", seed: int = 0, learn_scale: bool = False,
                          scale_dtype: torch.dtype = torch.float32):
    """The dense ``base_dir`` model with every packed Linear of ``ckpt`` wrapped in FakeQuantLinear on the
    checkpoint's grid (the QAD student's starting point). Its quantized forward equals the checkpoint exactly.

    ``latent_init`` places the trainable latent weights: ``"grid"`` at the de-quantized values (the paper's
    choice: every latent sits at a bin centre, so no weight flips until it has moved half a step, and Adam's
    early sign-like steps then move many across at once); ``"jitter"`` uniformly inside the same bins (seeded):
    the quantized model is unchanged, but the first small steps flip only the latents nearest a threshold."""
    from transformers import AutoModelForCausalLM
    if latent_init not in LATENT_INITS:
        raise ValueError(f"latent_init must be one of {LATENT_INITS}, not {latent_init!r}")
    gen = torch.Generator().manual_seed(seed)
    ints, scales, group, bits = read_grid(ckpt)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=dtype)
    with torch.no_grad():
        for name, q in ints.items():
            lin = model.get_submodule(name)
            deq = dequantize(q.to(torch.float32), scales[name], group)
            if latent_init == "jitter":
                # same integers, latents spread uniformly over the inner 90% of their bins (seeded)
                s_full = scales[name].repeat_interleave(group, 1)
                deq = deq + (torch.rand(deq.shape, generator=gen) - 0.5) * 0.9 * s_full
            lin.weight.copy_(deq.to(dtype))
    apply_fake_quant(model, scales, group, bits, learn_scale, scale_dtype)
    return model, group, bits
