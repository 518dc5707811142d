"""What this CPU does, and what stage 05's one-process vLLM jobs save (issue 13). One run, one machine:

    .venv/bin/python benchmarks/cpu_machine_and_vllm_jobs.py --data runs/smol/00_data \
        --out benchmarks/cpu-machine-vllm-jobs/cpu-machine-vllm-jobs.json

* machine: the ISA flags that decide the bf16 path (``amx_bf16`` / ``amx_tile``: Intel AMX; ``avx512_bf16``), and
  a square matmul (2048^3, median of 5) in bf16 and fp32 on 1 thread and on every core. Issue 13's budget (the
  whole `smol` DAG in 30 min) was written for a machine with AMX (~830 GFLOP/s in bf16); this is what runs here.
* vLLM offline jobs: ``--jobs`` plain jobs of stage 05's shape (the FP target, ``eval_prompts`` validation prompts x
  ``eval_new_tokens`` tokens, batch 1, bf16), each as its own worker process (``serving.job_in_subprocess``, the old stage 05)
  against all in one worker process with the engine in-process (``serving.jobs_in_one_process``, the new one). Wall time
  around the whole call (process start, vLLM import, engine start, generation, shutdown); the tokens must match.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from qdflash.config import DrafterConfig, load_config
from qdflash.drafter_train import eval_prompts
from qdflash.models import resolve_target
from qdflash.runio import git_sha, write_json
from qdflash.vllm_jobs import job_in_subprocess, jobs_in_one_process


def machine(n: int = 2048, reps: int = 5) -> dict:
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    out = {"cores": os.cpu_count(), "flags": {k: k in flags for k in ("amx_tile", "amx_bf16", "avx512_bf16",
                                                                        "avx512f", "avx512_vnni")}}
    threads0 = torch.get_num_threads()
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    for th in sorted({1, os.cpu_count() or 1}):
        torch.set_num_threads(th)
        for dt in (torch.bfloat16, torch.float32):
            x, y = a.to(dt), b.to(dt)
            x @ y
            ts = []
            for _ in range(reps):
                t = time.perf_counter()
                x @ y
                ts.append(time.perf_counter() - t)
            out[f"matmul_{str(dt).split('.')[-1]}_{th}t_gflops"] = 2 * n ** 3 / statistics.median(ts) / 1e9
    torch.set_num_threads(threads0)
    return out


def vllm_jobs(data_dir: str, n_jobs: int) -> dict:
    cfg = load_config(DrafterConfig, "smol")
    prompts = eval_prompts(data_dir, cfg.eval_prompts)
    job = {"prompts": prompts, "max_tokens": cfg.eval_new_tokens, "num_speculative_tokens": cfg.block_size - 1,
           "max_model_len": 1024, "dtype": "bfloat16", "target": str(Path(resolve_target("smol")).resolve()),
           "drafter": None}
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        old = [job_in_subprocess(job, Path(d), f"old{i}") for i in range(n_jobs)]
        t_old = time.perf_counter() - t
        t = time.perf_counter()
        new = jobs_in_one_process({f"new{i}": job for i in range(n_jobs)}, Path(d), "new")
        t_new = time.perf_counter() - t
    for r in old + list(new.values()):
        if "error" in r:
            raise RuntimeError(r["error"])
    new = list(new.values())
    return {"jobs": n_jobs, "prompts": len(prompts), "max_tokens": cfg.eval_new_tokens,
            "old_separate_processes": {"wall_s": t_old, "engine_start_s": [r["init_s"] for r in old],
                                       "generate_s": [r["generate_s"] for r in old]},
            "new_one_process_inproc": {"wall_s": t_new, "engine_start_s": [r["init_s"] for r in new],
                                       "generate_s": [r["generate_s"] for r in new]},
            "same_tokens": all(o["tokens"] == n["tokens"] for o, n in zip(old, new)),
            "saved_s_per_job": (t_old - t_new) / n_jobs, "ratio": t_old / t_new}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="a smol 00_data run directory (stage 05's prompts)")
    ap.add_argument("--out", default="benchmarks/cpu-machine-vllm-jobs/cpu-machine-vllm-jobs.json")
    ap.add_argument("--jobs", type=int, default=3)
    a = ap.parse_args()
    res = {"command": " ".join([Path(sys.executable).name] + sys.argv), "git_sha": git_sha(),
           "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": machine()}
    print({k: round(v) if isinstance(v, float) else v for k, v in res["machine"].items()}, flush=True)
    res["vllm_jobs"] = vllm_jobs(a.data, a.jobs)
    v = res["vllm_jobs"]
    print(f"vLLM jobs: {v['old_separate_processes']['wall_s']:.0f} s separate vs "
          f"{v['new_one_process_inproc']['wall_s']:.0f} s one process ({v['ratio']:.2f}x), same tokens "
          f"{v['same_tokens']}", flush=True)
    write_json(a.out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
