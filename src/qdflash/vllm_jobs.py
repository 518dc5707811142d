"""Jobs for real vLLM, which lives in its own virtual environment (``.venv-vllm``): the environment a job runs with,
one offline job (``qdflash.vllm_worker``) in a subprocess, several in one process, and the check that a drafter is
one vLLM's ``dflash`` method can serve. Stage 00 regenerates through it and stage 05 serves through it."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from .runio import REPO_ROOT, write_json

# what every job loads inside the vLLM venv: ``QDFLASH_VLLM_PLUGIN=1`` (vllm_env) enables this module, registered
# through the ``vllm.general_plugins`` entry point, and ``WORKER`` runs the job
PLUGIN_MODULE = "vllm_plugin.qdflash_vllm"
WORKER = "qdflash.vllm_worker"


def vllm_python() -> Path:
    p = Path(os.environ.get("QDFLASH_VLLM_VENV", REPO_ROOT / ".venv-vllm")) / "bin" / "python"
    if not p.exists():
        raise FileNotFoundError(f"vLLM environment not found at {p.parent.parent}: run `make setup-vllm`")
    return p


def vllm_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    venv = vllm_python().parent.parent
    iomp = next(iter(sorted(venv.glob("lib/libiomp5.so"))), None)
    env.update({"VLLM_CPU_KVCACHE_SPACE": env.get("VLLM_CPU_KVCACHE_SPACE", "1"), "HF_HUB_OFFLINE": "1",
                "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 2) - 1))),
                "PYTHONPATH": str(REPO_ROOT / "src"), "QDFLASH_VLLM_PLUGIN": "1", "TOKENIZERS_PARALLELISM": "false"})
    if iomp is not None:
        env["LD_PRELOAD"] = str(iomp)
    # INT4 layers as W4A16, the method's numerics (and vLLM's on a GPU): vllm-cpu 0.32 by default runs them as W4A8 on
    # a CPU with AMX tiles (int4_scaled_mm_cpu: bf16 activations quantized to int8 on every call), another quantized
    # model (benchmarks/cpu-wna16-linear/). An explicit VLLM_CPU_INT4_W4A8=1 in the environment still chooses it.
    env.setdefault("VLLM_CPU_INT4_W4A8", "0")
    env.update(extra or {})
    return env


def all_cores_env() -> dict:
    """vLLM-CPU environment for batched offline generation on every core of this process. vllm-cpu's default
    ("auto") reserves one core for the front end and runs the model on the rest: one of two here. Measured on
    the 2-core machine (128 smol prompts x 128 tokens, bf16): 491 tok/s on both cores against 279 on one."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if len(cores) < 2 or cores != list(range(cores[0], cores[-1] + 1)):
        return {}
    return {"VLLM_CPU_OMP_THREADS_BIND": f"{cores[0]}-{cores[-1]}", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(len(cores)))}


def unexported_draft_vocab(drafter: str | None) -> int:
    """The size of ``drafter``'s reduced draft vocabulary when it is still in this package's form (``d2t`` = the token
    ids), which vLLM would misread; 0 for no drafter, a whole-vocabulary one, or an export
    (``drafter.export_draft_vocab_for_vllm``: EAGLE-3's form, top-level ``draft_vocab_size``, ``d2t`` as offsets)."""
    if not drafter:
        return 0
    cfg_path = Path(drafter) / "config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
    n = (cfg.get("dflash_config") or {}).get("draft_vocab_size")
    return int(n) if n and cfg.get("draft_vocab_size") != n else 0


def check_servable_drafter(drafter: str | None) -> None:
    """vLLM's ``dflash`` model reads a reduced draft vocabulary in EAGLE-3's form (top-level ``draft_vocab_size``,
    its own ``lm_head``, ``d2t`` as offsets); a drafter saved by this package keeps the token ids themselves in
    ``d2t`` and would propose wrong tokens there, so it is refused in one line until exported
    (``drafter.export_draft_vocab_for_vllm``)."""
    n = unexported_draft_vocab(drafter)
    if n:
        raise ValueError(f"{drafter} has a reduced draft vocabulary ({n} tokens) in this package's form; export it "
                         "for vLLM first (qdflash.drafter.export_draft_vocab_for_vllm)")


def job_in_subprocess(job: dict, work: Path, name: str, extra_env: dict | None = None, timeout: int = 900,
            stream: bool = False) -> dict:
    """One ``qdflash.vllm_worker`` job in the vLLM venv; its output goes to ``work/log-NAME.txt`` (and, with
    ``stream``, the worker's progress lines also to stdout)."""
    check_servable_drafter(job.get("drafter"))
    work = Path(work).resolve()              # the worker runs with cwd=work: relative paths would break
    jf, of = work / f"job-{name}.json", work / f"result-{name}.json"
    of.unlink(missing_ok=True)
    write_json(jf, job)
    cmd = [str(vllm_python()), "-m", WORKER, str(jf), str(of)]
    with open(work / f"log-{name}.txt", "w") as log:
        if not stream:
            p = subprocess.run(cmd, env=vllm_env(extra_env), stdout=log, stderr=subprocess.STDOUT, timeout=timeout,
                               cwd=work)
        else:
            p = subprocess.Popen(cmd, env=vllm_env(extra_env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 cwd=work, text=True)
            for line in p.stdout:
                log.write(line)
                if line.startswith(job.get("mode", "") + ":"):
                    print(line.rstrip(), flush=True)
            p.wait(timeout=timeout)
    if not of.exists():
        raise RuntimeError(f"vLLM job {name} exited {p.returncode} without a result; see {work}/log-{name}.txt")
    return json.loads(of.read_text())


def jobs_in_one_process(jobs: dict[str, dict], work: Path, name: str, extra_env: dict | None = None,
             timeout_per_job: int = 900) -> dict[str, dict]:
    """Several offline jobs in one ``qdflash.vllm_worker`` process, one after another, the engine in-process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): vLLM is imported once and no engine-core or worker process is spawned
    per job (``benchmarks/cpu_machine_and_vllm_jobs.py`` times both ways). Every job gets its own ``LLM`` with the
    job's settings. A job the shared worker did not finish (it raised, crashed or timed out) and every job after it
    run alone with ``job_in_subprocess``, with a warning; each result says where it ran (``engine``)."""
    for job in jobs.values():
        check_servable_drafter(job.get("drafter"))
    work = Path(work).resolve()
    of = work / f"result-{name}.json"
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", **(extra_env or {})}
    try:
        job_in_subprocess({"mode": "jobs", "jobs": jobs}, work, name, env, timeout=timeout_per_job * len(jobs))
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"vLLM jobs: the shared worker stopped ({type(e).__name__}); see {work}/log-{name}.txt", flush=True)
    done = json.loads(of.read_text()) if of.exists() else {}
    out = {}
    for k, j in jobs.items():
        if k not in done:
            print(f"vLLM jobs: {k} runs in its own process", flush=True)
        out[k] = done[k] if k in done else {**job_in_subprocess(j, work, f"{name}-{k}", extra_env, timeout=timeout_per_job),
                                            "engine": "own process"}
    return out
