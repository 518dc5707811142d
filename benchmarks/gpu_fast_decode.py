"""Batch-1 decode speed of the eager reference decoder vs the fast path (issue 19), plain and speculative.

    python benchmarks/gpu_fast_decode.py --device cuda --target smol --dtype bfloat16 \\
        --drafter fp32=runs/smol/03_drafter_finetune/<two_stage> --drafter w4a16=runs/smol/04_drafter_quant/<w4a16> \\
        --out benchmarks/results-h200-fast-decode.json
    python benchmarks/gpu_fast_decode.py --device cpu --target tiny --dtype float32 --drafter random \\
        --prompts 2 --new-tokens 24 --out /tmp/fast-decode-smoke.json          # CPU smoke check

Modes: ``eager`` (``speculative.generate``: DynamicCache, all hidden states), ``fast`` (``fast_decode.FastDecoder``:
static caches, fixed shapes, no compile), ``graphs`` (the same with ``torch.compile(mode="reduce-overhead")``,
i.e. CUDA graphs; CUDA only) and ``fused`` (graphs with one call a step: draft, verify and the target's argmax in one
graph, ``FastDecoder(fused=True)``; on the CPU without compile, a smoke check). Reported, all measured in this run:

* plain tok/s per mode, against the weight-bandwidth floor (bytes of the target's weights / ``--bandwidth-tbs``,
  4.8 TB/s = H200 HBM3e) and a launch-bound estimate: kernels per plain step (counted with torch.profiler on the
  eager and fast paths) x the measured time to issue one small op from Python (eager) or to run one kernel inside
  a replayed CUDA graph (graphs);
* per drafter (``name=DIR``, a saved drafter; ``random`` = an untrained one of the preset's shape, for smoke
  checks; W8A16/W4A16 checkpoints load de-quantized): tok/s, tau, per-step draft and verify time and the drafter
  share (from a run that synchronises after the draft), speedup over plain in the same mode, and the speedup the
  step times predict, tau x t_plain / (t_draft + t_verify), with the issue's goals;
* losslessness: outputs that differ from plain decoding (and fast/graphs from eager plain). In bf16 a difference is
  expected from near-ties; each one is reported with its first position and the target's top-1/top-2 logit gap there.

Eager runs are slow on a GPU (Python-bound), so they use the first ``--eager-prompts`` prompts only (0: none).
``--rounds N`` then times plain against each drafter in the ``--headline-mode`` (``headline.reference_mode``) in N
alternating rounds on the decoders already warmed up (median and range of the per-round speedup), each drafter's
right after its own pass. Plain decoding in the rounds runs on its own copy of the target: a drafter's decoder hooks
the target's layers to capture features, and when the rounds' plain decoder shared that target
(`run-1207d-h100/`) its first round ran at a fifth of its own pass's speed and the others ~10% below it, most likely
its compiled step recompiling with the hooks in place; the rounds record how many graphs were compiled while they ran.
Writes JSON with the command, the git SHA and the environment.
"""
from __future__ import annotations

import argparse
import copy
import json
import shlex
import sys
import time
from pathlib import Path

import torch

from qdflash.drafter import load_drafter, new_drafter
from qdflash.fast_decode import FastDecoder
from qdflash.models import load_model, load_tokenizer, mask_token_id
from qdflash.runio import git_sha, write_json
from qdflash.decode_stats import GenResult, acceptance_stats, speedup_ci95
from qdflash.speculative import generate

TEXTS = ("Tell me about the moon and its phases.", "Write a short poem about a quiet river at night.",
         "Explain how a hash table works, with an example.", "List five uses of water in a city and why they matter.",
         "Compare cats and dogs as pets for a small apartment.", "Describe a market in the morning, step by step.",
         "Why is the sky blue? Explain it to a child.", "Write a recipe for a simple tomato soup.")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def load_prompts(tok, data: str | None, n: int) -> list[list[int]]:
    if data:
        from qdflash.data import load_split
        rows = load_split(data, "val")[:n]
        return [r["input_ids"][: r["prompt_len"]] for r in rows]
    from qdflash.data import prompt_ids
    return [prompt_ids(tok, TEXTS[i % len(TEXTS)]) for i in range(n)]


def make_drafter(spec: str, target, tok, preset: str, device: torch.device, dtype: torch.dtype):
    if spec == "random":
        from qdflash.config import DrafterConfig, load_config
        cfg = load_config(DrafterConfig, preset)
        d = new_drafter(target, cfg.num_layers, cfg.block_size, cfg.target_layer_ids,
                        mask_token_id(tok, cfg.mask_token_id))
    else:
        d = load_drafter(spec)
    return d.to(device, dtype).eval()


def summarize(results: list[GenResult], speculative: bool) -> dict:
    steps = sum(len(r.accept_lengths) for r in results)
    tok = sum(len(r.tokens) - 1 for r in results)
    dec = sum(r.decode_time_s for r in results)
    out = {"prompts": len(results), "decode_tokens": tok, "steps": steps, "decode_time_s": dec,
           "tokens_per_s": tok / max(dec, 1e-12), "step_ms": 1e3 * dec / max(steps, 1)}
    if speculative:
        st = acceptance_stats(results)
        draft, verify = sum(r.draft_time_s for r in results), sum(r.verify_time_s for r in results)
        out.update({"tau": st["tau"], "tau_ci95": st["tau_ci95"], "draft_ms": 1e3 * draft / max(steps, 1),
                    "verify_ms": 1e3 * verify / max(steps, 1), "drafter_share": draft / max(dec, 1e-12)})
    return out


def divergence(target, prompt: list[int], ref: list[int], other: list[int]) -> dict:
    """First position where two outputs differ and the target's top-1/top-2 logit gap there (small = near-tie)."""
    i = next(j for j, (a, b) in enumerate(zip(ref, other)) if a != b)
    dev = next(target.parameters()).device
    with torch.no_grad():
        logits = target(input_ids=torch.tensor([prompt + ref[:i]], device=dev), logits_to_keep=1).logits[0, -1]
    top = logits.float().topk(2).values
    return {"position": i, "tokens": [ref[i], other[i]], "top1_top2_logit_gap": float(top[0] - top[1])}


def compare(target, prompts, ref: list[GenResult], other: list[GenResult]) -> dict:
    bad = [(p, a.tokens, b.tokens) for p, a, b in zip(prompts, ref, other) if a.tokens != b.tokens]
    return {"mismatched_outputs": len(bad), "of": len(other),
            "divergences": [divergence(target, p, a, b) for p, a, b in bad]}


def launch_times(device: torch.device, n: int = 3000) -> dict:
    """Seconds per small op issued from Python (async; what an eager decode step pays per kernel), and per kernel
    inside a replayed CUDA graph."""
    x = torch.zeros(1, device=device)
    for _ in range(200):
        x.add_(1)
    sync(device)
    t = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    sync(device)
    out = {"eager_op_us": 1e6 * (time.perf_counter() - t) / n}
    if device.type == "cuda":
        k, reps = 500, 20
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            x.add_(1)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(k):
                x.add_(1)
        g.replay()
        sync(device)
        t = time.perf_counter()
        for _ in range(reps):
            g.replay()
        sync(device)
        out["graph_kernel_us"] = 1e6 * (time.perf_counter() - t) / (k * reps)
    return out


def kernels_per_step(run, device: torch.device, n_new: int) -> float:
    """Kernels (CUDA) or leaf aten ops (CPU) per decode step: profile ``run(n_new)`` and ``run(1)`` (prefill only)
    and divide the difference by the ``n_new - 1`` steps."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])

    def count(n: int) -> int:
        with profile(activities=acts) as prof:
            run(n)
            sync(device)
        ev = prof.events()
        if device.type == "cuda":
            return sum(1 for e in ev if e.device_type == DeviceType.CUDA)
        return sum(1 for e in ev if e.name.startswith("aten::")
                   and not any(c.name.startswith("aten::") for c in e.cpu_children))
    return (count(n_new) - count(1)) / (n_new - 1)


def decode(fn, prompts, n_new: int) -> list[GenResult]:
    return [fn(p, n_new) for p in prompts]


def timing_rounds(plain_fd: FastDecoder, spec_fd: FastDecoder, prompts, n: int, rounds: int) -> dict:
    """Plain (``plain_fd``) against one drafter's decoder (``spec_fd``), both warmed up, in ``rounds`` rounds, the
    order alternating from round to round (``serving.interleaved_timing_jobs``), each round decoding every prompt:
    tokens/s per side and the per-round speedup's median and range (``serving.timing_summary``)."""
    from qdflash.serving import interleaved_timing_jobs, timing_summary
    from torch._dynamo.utils import counters
    fds = {"plain": plain_fd, "spec": spec_fd}
    results = {}
    graphs = counters["stats"]["unique_graphs"]
    for job, side in interleaved_timing_jobs({"side": "plain"}, {"side": "spec"}, rounds).items():
        runs = [fds[side["side"]].generate(p, n, split_timing=False) for p in prompts]
        st = summarize(runs, False)
        results[job] = {"output_tokens_per_s": st["tokens_per_s"], "tokens": [r.tokens for r in runs]}
    return timing_summary(results) | {"prompts": len(prompts),
                                      "graphs_compiled_during_rounds": counters["stats"]["unique_graphs"] - graphs}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--target", default="smol", help="a preset (smol, tiny) or a model directory (e.g. the QAD one)")
    ap.add_argument("--preset", default=None, help="drafter preset for --drafter random (default: the target)")
    ap.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                    help="default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--drafter", action="append", default=[], help="NAME=DIR, DIR, or random (repeatable)")
    ap.add_argument("--data", default=None, help="a stage-00 directory: use its val prompts")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--eager-prompts", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--window", type=int, default=None, help="drafter context window (default: drafter config)")
    ap.add_argument("--bandwidth-tbs", type=float, default=None,
                    help="memory bandwidth for the floor (default: by the GPU's name, H100 3.35, H200 4.8 TB/s)")
    ap.add_argument("--no-graphs", action="store_true")
    ap.add_argument("--modes", default="fast,graphs", help="static-cache modes to run, of fast, graphs, fused "
                    "(eager runs on --eager-prompts); graphs or fused alone fits a short device call")
    ap.add_argument("--headline-mode", default=None, help="the mode of the headline and of --rounds (default: fused, "
                    "else graphs, else fast, of those run)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=0, help="then time plain against each drafter in this many rounds, "
                    "the order alternating, in the reference mode, on its warmed-up decoders: median and range of the "
                    "per-round speedup")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    t_start = time.time()
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    dtype_name = a.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    dtype = getattr(torch, dtype_name)
    graphs = device.type == "cuda" and not a.no_graphs
    import transformers
    res: dict = {"command": " ".join(shlex.quote(x) for x in [sys.executable] + sys.argv), "git_sha": git_sha(),
                 "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                 "torch": torch.__version__, "transformers": transformers.__version__, "dtype": dtype_name,
                 "target": a.target, "batch": 1, "new_tokens": a.new_tokens, "eos": None,
                 "notes": ["fixed token budget (no EOS stop); eager runs on the first --eager-prompts prompts",
                           "W8A16/W4A16 drafters run de-quantized (speed as the fp drafter; tau shows quantization)",
                           "graphs: torch.compile(mode='reduce-overhead', dynamic=False), warmed up before timing"]}
    if not graphs:
        res["notes"].append("graphs mode skipped (" + ("--no-graphs" if a.no_graphs else "CUDA graphs need CUDA") + ")")
    tok = load_tokenizer(a.target)
    target = load_model(a.target, dtype_name, str(device))
    prompts = load_prompts(tok, a.data, a.prompts)
    eager_prompts = prompts[: a.eager_prompts]
    n = a.new_tokens
    drafters = {}
    for spec in a.drafter:
        name, _, path = spec.partition("=") if "=" in spec else (spec, "", spec)
        drafters[name] = make_drafter(path, target, tok, a.preset or a.target, device, dtype)
    max_B = max([d.block_size for d in drafters.values()] + [1])
    max_len = max(len(p) for p in prompts) + n + max_B + 8

    wbytes = sum(p.numel() * p.element_size() for p in target.parameters())
    if a.bandwidth_tbs is None:
        name = res["device"]
        a.bandwidth_tbs = 3.35 if "H100" in name else 4.8
        res["notes"].append(f"floor at {a.bandwidth_tbs} TB/s, chosen by the device name ({name}; H100 SXM 3.35, "
                            "H200 4.8, else 4.8): pass --bandwidth-tbs for another card")
    floor = a.bandwidth_tbs * 1e12 / wbytes
    res["weights"] = {"params": sum(p.numel() for p in target.parameters()), "bytes": wbytes,
                      "bandwidth_tbs": a.bandwidth_tbs, "floor_tokens_per_s": floor}
    res["launch"] = launch_times(device)
    print(f"weights {wbytes / 1e6:.1f} MB, floor {floor:.0f} tok/s; launch {res['launch']}", flush=True)

    def fast_decoder(drafter, compiled: bool, window: int | None = None, fused: bool = False, on=None
                     ) -> tuple[FastDecoder, float]:
        fd = FastDecoder(target if on is None else on, drafter, max_len=max_len, window=window, compile=compiled,
                         fused=fused)
        t = time.perf_counter()
        for _ in range(3 if compiled else 1):          # warm-up (compile, cudagraph warm-up and record)
            fd.generate(prompts[0], min(n, 16 + max_B))
        sync(device)
        return fd, time.perf_counter() - t

    # ------------------------------------------------------------------------------------------------ plain
    plain: dict = {}
    eager_plain: list[GenResult] = []
    if eager_prompts:
        generate(target, prompts[0], 8)                                                # eager warm-up
        eager_plain = decode(lambda p, k: generate(target, p, k), eager_prompts, n)
        plain["eager"] = summarize(eager_plain, False)
    wanted = a.modes.split(",")
    unknown = sorted(set(wanted) - {"fast", "graphs", "fused"})
    if unknown:
        ap.error(f"unknown --modes {unknown}: use fast, graphs, fused")
    # mode -> (compiled, fused); graphs and fused compile on CUDA only (on the CPU fused runs uncompiled, a smoke check)
    modes = ({"fast": (False, False)} if "fast" in wanted or not graphs else {}) | (
        {"graphs": (True, False)} if graphs and "graphs" in wanted else {}) | (
        {"fused": (graphs, True)} if "fused" in wanted else {})
    ref_mode = a.headline_mode or next(m for m in ("fused", "graphs", "fast") if m in modes)
    if ref_mode not in modes:
        ap.error(f"--headline-mode {ref_mode} is not among the modes run ({', '.join(modes)})")
    res["headline"] = {"reference_mode": ref_mode}     # completed at the end; a cut run's JSON names its mode too
    # the headline mode's warmed-up plain decoder, for --rounds. A drafter's decoder hooks the target's layers while it
    # is open (each is closed right after its own pass), and the rounds run while one is open: the rounds' plain
    # decoder therefore decodes on its own copy of the target, which no drafter's capture hooks ever touch
    plain_kept: FastDecoder | None = None
    plain_runs: dict[str, list[GenResult]] = {}
    plain_target = copy.deepcopy(target) if a.rounds else None
    for mode, (compiled, fused) in modes.items():
        fd, warm = fast_decoder(None, compiled, fused=fused, on=plain_target if mode == ref_mode else None)
        plain_runs[mode] = decode(fd.generate, prompts, n)
        plain[mode] = summarize(plain_runs[mode], False) | {"warmup_s": warm}
        if eager_plain:
            plain[mode]["vs_eager_plain"] = compare(target, eager_prompts, eager_plain, plain_runs[mode])
        if mode == ref_mode and a.rounds:
            plain_kept = fd
        else:
            fd.close()
    lt = res["launch"]
    kinds = "CUDA kernels" if device.type == "cuda" else "leaf aten ops (CPU)"
    plain["kernels_per_step"], plain["launch_bound_tokens_per_s"] = {"unit": kinds}, {}
    if eager_plain:
        k_eager = kernels_per_step(lambda k: generate(target, prompts[0], k), device, min(n, 16))
        plain["kernels_per_step"]["eager"] = k_eager
        plain["launch_bound_tokens_per_s"]["eager"] = 1e6 / (k_eager * lt["eager_op_us"])
    fd, _ = fast_decoder(None, False)
    k_fast = kernels_per_step(lambda k: fd.generate(prompts[0], k), device, min(n, 16))
    fd.close()
    for mode, st in list(plain.items()):
        if isinstance(st, dict) and "tokens_per_s" in st:
            st["fraction_of_floor"] = st["tokens_per_s"] / floor
    plain["kernels_per_step"]["fast"] = k_fast
    plain["launch_bound_tokens_per_s"]["fast"] = 1e6 / (k_fast * lt["eager_op_us"])
    if "graph_kernel_us" in lt:
        plain["launch_bound_tokens_per_s"]["graphs"] = 1e6 / (k_fast * lt["graph_kernel_us"])
    res["plain"] = plain
    print(json.dumps(plain, indent=1), flush=True)

    # ------------------------------------------------------------------------------------------------ speculative
    res["speculative"] = {}
    for name, d in drafters.items():
        dc = d.config.dflash_config
        win = a.window if a.window is not None else (dc.get("swa_window_size") if dc.get("use_swa") else None)
        out: dict = {"block_size": d.block_size, "target_layer_ids": d.target_layer_ids, "window": win}
        if eager_plain:
            generate(target, prompts[0], 8, d, window=win)
            eager = decode(lambda p, k: generate(target, p, k, d, window=win), eager_prompts, n)
            out["eager"] = summarize(eager, True) | {"vs_plain": compare(target, eager_prompts, eager_plain, eager)}
            out["eager"]["speedup"] = out["eager"]["tokens_per_s"] / plain["eager"]["tokens_per_s"]
        for mode, (compiled, fused) in modes.items():
            fd, warm = fast_decoder(d, compiled, win, fused=fused)
            runs = [fd.generate(p, n, split_timing=False) for p in prompts]
            # a fused step cannot be split: draft and verify times come from the unfused modes
            split = None if fused else [fd.generate(p, n, split_timing=True) for p in prompts]
            if mode == ref_mode and a.rounds:       # its rounds, on this warmed-up decoder, before it is closed
                t = timing_rounds(plain_kept, fd, prompts, n, a.rounds)
                first = plain[mode]["tokens_per_s"]
                res.setdefault("timing", {})[name] = t | {
                    "plain_target": "own copy", "plain_first_pass_tokens_per_s": first,
                    "plain_rounds_over_first_pass": t["plain_tokens_per_s"]["median"] / first}
            fd.close()
            st = summarize(runs, True) | {"warmup_s": warm}
            st["vs_plain"] = compare(target, prompts, plain_runs[mode], runs)
            st["speedup"] = st["tokens_per_s"] / plain[mode]["tokens_per_s"]
            st["speedup_ci95"] = speedup_ci95(plain_runs[mode], runs)
            if split is None:
                st.update({"draft_ms": None, "verify_ms": None, "drafter_share": None, "predicted_speedup": None})
            else:
                sp = summarize(split, True)
                st.update({k: sp[k] for k in ("draft_ms", "verify_ms", "drafter_share")})
                t_plain = plain[mode]["step_ms"]
                st["verify_over_plain_step"] = sp["verify_ms"] / t_plain
                st["predicted_speedup"] = st["tau"] * t_plain / (sp["draft_ms"] + sp["verify_ms"])
                st["goal_0p8_of_predicted"] = st["speedup"] >= 0.8 * st["predicted_speedup"]
            if st["tau"] >= 2.5:
                st["goal_2x_at_tau_2p5"] = st["speedup"] >= 2.0
            out[mode] = st
        res["speculative"][name] = out
        write_json(Path(a.out), res)                    # partial results survive a cut call
        print(name, json.dumps({m: {k: v for k, v in s.items() if not isinstance(v, dict)}
                                for m, s in out.items() if isinstance(s, dict)}, indent=1), flush=True)
    if a.rounds:
        plain_kept.close()
        write_json(Path(a.out), res)
        print(json.dumps({k: v["speedup"] for k, v in res.get("timing", {}).items()}, indent=1), flush=True)
    res["wall_s"] = round(time.time() - t_start, 1)
    res["headline"] |= {"plain_tokens_per_s": {m: plain[m]["tokens_per_s"] for m in ["eager"] + list(modes) if m in plain},
                       "floor_tokens_per_s": floor, "reference_mode": ref_mode,
                       "speculative": {k: {"tau": v[ref_mode]["tau"], "tokens_per_s": v[ref_mode]["tokens_per_s"],
                                           "speedup": v[ref_mode]["speedup"],
                                           "predicted_speedup": v[ref_mode]["predicted_speedup"],
                                           "drafter_share": v[ref_mode]["drafter_share"]}
                                       for k, v in res["speculative"].items()}}
    write_json(Path(a.out), res)
    print(json.dumps(res["headline"], indent=1))
    return res


if __name__ == "__main__":
    main()
