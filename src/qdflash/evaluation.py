"""Stage 06: quality gates with lm-eval.

``full``: the real tasks, ``mmlu_pro`` (5-shot, exact_match custom-extract; size-weighted group score and the
unweighted mean over the 14 subjects), ``ifeval`` (inst/prompt-level strict acc) and ``gpqa_diamond_cot_zeroshot``
(flexible-extract) on the hf backend, with the competition thresholds 0.621 / 0.814 / 0.630 as pass/fail.

Offline presets: local task YAMLs written into the run directory (absolute data paths) over small generated data in
the same three formats: 10-option multiple choice with CoT and ``answer is (X)`` extraction in two "subjects",
IFEval-format prompts scored by lm-eval's own IFEval checker (with a locally trained NLTK ``punkt_tab``), and a
4-option graduate-style MC with the GPQA flexible-extract filter. Teacher vs RTN vs GPTQ vs QAD target on the hf
backend; with vs without speculation through ``SpecLM``, an lm-eval ``LM`` around the reference speculative decoder
(greedy speculation must not change a single output).
"""
from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

from .config import EvalConfig
from .runio import cache_dir, device, finish_run, read_json, start_run, write_jsonl

TASKS_FULL = {"mmlu_pro": "exact_match,custom-extract", "ifeval": "inst_level_strict_acc,none",
              "gpqa_diamond_cot_zeroshot": "exact_match,flexible-extract"}
LETTERS = "ABCDEFGHIJ"


@dataclass
class EvalResult:
    out_dir: Path
    metrics: dict


# ----------------------------------------------------------------------------------------------- local data
def make_mc(n: int, subject: str, seed: int) -> list[dict]:
    rng = random.Random(f"{subject}-{seed}")
    rows = []
    for i in range(n):
        a, b = rng.randint(2, 30), rng.randint(2, 30)
        ans = a + b if subject == "add" else a * b
        opts = {ans}
        while len(opts) < 10:
            opts.add(ans + rng.choice([-1, 1]) * rng.randint(1, 15))
        opts = sorted(opts)
        rng.shuffle(opts)
        q = f"What is {a} {'+' if subject == 'add' else 'times'} {b}?"
        rows.append({"question": q, "options": [str(o) for o in opts], "answer": LETTERS[opts.index(ans)]})
    return rows


_ELEMENTS = [("H", "hydrogen"), ("He", "helium"), ("C", "carbon"), ("N", "nitrogen"), ("O", "oxygen"),
             ("Na", "sodium"), ("Fe", "iron"), ("Cu", "copper"), ("Ag", "silver"), ("Au", "gold"), ("K", "potassium"),
             ("Ca", "calcium"), ("Cl", "chlorine"), ("S", "sulfur"), ("P", "phosphorus"), ("Mg", "magnesium"),
             ("Zn", "zinc"), ("Pb", "lead"), ("Sn", "tin"), ("Hg", "mercury")]


def make_gpqa(n: int, seed: int) -> list[dict]:
    rng = random.Random(f"gpqa-{seed}")
    rows = []
    for i in range(n):
        sym, name = _ELEMENTS[i % len(_ELEMENTS)]
        wrong = rng.sample([e for e in _ELEMENTS if e[0] != sym], 3)
        choices = [name] + [w[1] for w in wrong]
        rng.shuffle(choices)
        rows.append({"Question": f" Which element has the chemical symbol {sym}?", "choice1": choices[0],
                     "choice2": choices[1], "choice3": choices[2], "choice4": choices[3],
                     "choices": choices, "answer": f"({'ABCD'[choices.index(name)]})"})
    return rows


_IF = [("punctuation:no_comma", {}, "Do not use any commas in your response."),
       ("change_case:english_lowercase", {}, "Your entire response should be in English, and in all lowercase letters."),
       ("length_constraints:number_words", {"relation": "less than", "num_words": 40},
        "Answer with less than 40 words."),
       ("detectable_format:number_bullet_lists", {"num_bullets": 3},
        "Your answer must contain exactly 3 bullet points in markdown format, like: * point."),
       ("keywords:existence", {"keywords": ["water"]}, "Include the keyword water in the response."),
       ("detectable_format:title", {}, "Your answer must contain a title, wrapped in double angular brackets, "
                                       "such as <<poem of joy>>."),
       ("length_constraints:number_sentences", {"relation": "less than", "num_sentences": 4},
        "Your response should contain less than 4 sentences.")]
_TOPICS = ["the ocean", "a rainy day", "your favourite book", "cats", "the moon", "a city at night", "coffee",
           "mountains", "learning to cook", "trains"]


def make_ifeval(n: int, seed: int) -> list[dict]:
    rng = random.Random(f"ifeval-{seed}")
    rows = []
    for i in range(n):
        inst = _IF[i % len(_IF)]
        topic = _TOPICS[rng.randrange(len(_TOPICS))]
        rows.append({"key": i, "prompt": f"Write a short note about {topic}. {inst[2]}",
                     "instruction_id_list": [inst[0]], "kwargs": [inst[1]]})
    return rows


def ensure_punkt_tab() -> str:
    """Train a Punkt sentence model on local text and save it as NLTK ``punkt_tab`` (lm-eval's IFEval needs it)."""
    root = cache_dir() / "nltk_data"
    target = root / "tokenizers" / "punkt_tab" / "english"
    os.environ["NLTK_DATA"] = str(root)
    if (target / "ortho_context.tab").exists() or (target / "sent_starters.txt").exists():
        return str(root)
    root.mkdir(parents=True, exist_ok=True)
    for p in (root, root / "tokenizers", root / "tokenizers" / "punkt_tab", target):
        p.mkdir(exist_ok=True)
        os.chmod(p, 0o700)
    import nltk
    from nltk.tokenize.punkt import PunktTrainer, save_punkt_params

    from .models import synthetic_sentences
    if str(root) not in nltk.data.path:
        nltk.data.path.insert(0, str(root))
    text = " ".join(synthetic_sentences(3000, seed=5))
    lic = Path("/usr/share/common-licenses")
    if lic.exists():
        text += " ".join(p.read_text(errors="ignore") for p in sorted(lic.glob("*")) if p.is_file())[:2_000_000]
    tr = PunktTrainer()
    tr.train(text, finalize=True)
    params = tr.get_params()
    params.abbrev_types.update({"mr", "mrs", "dr", "e.g", "i.e", "etc", "vs"})
    save_punkt_params(params, dir=str(target))
    return str(root)


def _em_tail(max_gen_toks: int) -> str:
    """Shared YAML tail of the two multiple-choice tasks: greedy generation and exact match."""
    return f"""generation_kwargs:
  until: []
  do_sample: false
  max_gen_toks: {max_gen_toks}
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
    ignore_punctuation: true
metadata: {{version: 1.0}}
"""


def write_local_tasks(task_dir: Path, cfg: EvalConfig, seed: int = 0) -> dict[str, str]:
    """Write data + YAMLs (absolute data paths: lm-eval resolves relative ones against the cwd)."""
    task_dir.mkdir(parents=True, exist_ok=True)
    n_sub = max(1, cfg.n_mc // 2)
    tasks = {}
    for subj in ("add", "mul"):
        write_jsonl(task_dir / f"mc_{subj}.jsonl", make_mc(n_sub, subj, seed))
        name = f"local_mmlu_pro_{subj}"
        (task_dir / f"{name}.yaml").write_text(f"""task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {task_dir / f'mc_{subj}.jsonl'}
test_split: test
output_type: generate_until
doc_to_text: "The following is a multiple choice question. Think step by step and then finish your answer with \\"the answer is (X)\\" where X is the correct letter choice.\\nQuestion: {{{{question}}}}\\nOptions:\\n{{% for o in options %}}{{{{ 'ABCDEFGHIJ'[loop.index0] }}}}. {{{{ o }}}}\\n{{% endfor %}}Answer: Let's think step by step."
doc_to_target: answer
filter_list:
  - name: custom-extract
    filter:
      - function: regex
        regex_pattern: 'answer is \\(?([ABCDEFGHIJ])\\)?'
      - function: take_first
""" + _em_tail(cfg.max_gen_toks))
        tasks[name] = "exact_match,custom-extract"
    write_jsonl(task_dir / "ifeval.jsonl", make_ifeval(cfg.n_ifeval, seed))
    (task_dir / "utils.py").write_text("from lm_eval.tasks.ifeval.utils import process_results, agg_inst_level_acc  "
                                       "# noqa: F401\n")
    (task_dir / "local_ifeval.yaml").write_text(f"""task: local_ifeval
dataset_path: json
dataset_kwargs:
  data_files:
    test: {task_dir / 'ifeval.jsonl'}
test_split: test
output_type: generate_until
doc_to_text: prompt
doc_to_target: 0
generation_kwargs:
  until: []
  do_sample: false
  max_gen_toks: {cfg.max_gen_toks}
process_results: !function utils.process_results
metric_list:
  - metric: prompt_level_strict_acc
    aggregation: mean
    higher_is_better: true
  - metric: inst_level_strict_acc
    aggregation: !function utils.agg_inst_level_acc
    higher_is_better: true
  - metric: prompt_level_loose_acc
    aggregation: mean
    higher_is_better: true
  - metric: inst_level_loose_acc
    aggregation: !function utils.agg_inst_level_acc
    higher_is_better: true
metadata: {{version: 1.0}}
""")
    tasks["local_ifeval"] = "inst_level_strict_acc,none"
    write_jsonl(task_dir / "gpqa.jsonl", make_gpqa(cfg.n_gpqa, seed))
    (task_dir / "local_gpqa.yaml").write_text(f"""task: local_gpqa
dataset_path: json
dataset_kwargs:
  data_files:
    test: {task_dir / 'gpqa.jsonl'}
test_split: test
output_type: generate_until
doc_to_text: "What is the correct answer to this question:{{{{Question}}}}\\nChoices:\\n(A) {{{{choice1}}}}\\n(B) {{{{choice2}}}}\\n(C) {{{{choice3}}}}\\n(D) {{{{choice4}}}}\\nLet's think step by step: "
doc_to_target: answer
filter_list:
  - name: flexible-extract
    filter:
      - function: multi_choice_regex
        group_select: -1
        ignore_case: true
        ignore_punctuation: true
        regex_pattern: "(\\\\([A-Z]\\\\))"
      - function: take_first
""" + _em_tail(cfg.max_gen_toks))
    tasks["local_gpqa"] = "exact_match,flexible-extract"
    return tasks


# ----------------------------------------------------------------------------------------------- lm-eval glue
def _spec_lm_class():
    from lm_eval.api.model import LM

    class SpecLM(LM):
        """lm-eval generate_until through the reference (speculative) decoder, batch 1, greedy."""

        def __init__(self, target_dir: str, drafter_dir: str | None = None, max_gen_toks: int = 256):
            super().__init__()
            from transformers import AutoTokenizer

            from .drafter import load_drafter
            from .models import load_model
            self.tok = AutoTokenizer.from_pretrained(target_dir)
            self.model = load_model(target_dir)
            self.drafter = load_drafter(drafter_dir) if drafter_dir else None
            self.max_gen_toks = max_gen_toks
            self.outputs: list[str] = []
            self.accept_lengths: list[int] = []

        @property
        def tokenizer_name(self) -> str:
            return self.tok.name_or_path.replace("/", "__")

        def apply_chat_template(self, chat_history, add_generation_prompt=True) -> str:
            return self.tok.apply_chat_template(chat_history, tokenize=False,
                                                add_generation_prompt=add_generation_prompt)

        def generate_until(self, requests, disable_tqdm: bool = False):
            from .speculative import generate
            out = []
            for req in requests:
                ctx, kw = req.args
                n = int(kw.get("max_gen_toks", self.max_gen_toks))
                ids = self.tok(ctx, add_special_tokens=False)["input_ids"]
                r = generate(self.model, ids, n, self.drafter, 0.0, self.tok.eos_token_id)
                toks = [t for t in r.tokens if t != self.tok.eos_token_id]
                text = self.tok.decode(toks, skip_special_tokens=True)
                for stop in kw.get("until") or []:
                    if stop and stop in text:
                        text = text.split(stop)[0]
                self.accept_lengths += r.accept_lengths
                out.append(text)
            self.outputs += out
            return out

        def loglikelihood(self, requests, disable_tqdm: bool = False):
            raise NotImplementedError("SpecLM only serves generate_until tasks")

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
            raise NotImplementedError("SpecLM only serves generate_until tasks")

    return SpecLM


def _evaluate(model, tasks: dict[str, str], task_dir: Path | None, cfg: EvalConfig, model_args: str | None = None):
    import lm_eval
    from lm_eval.tasks import TaskManager
    tm = TaskManager(include_path=str(task_dir)) if task_dir else TaskManager()
    res = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=list(tasks), task_manager=tm,
                                  batch_size=cfg.batch_size, device=device(), apply_chat_template=True,
                                  limit=None, log_samples=False, random_seed=0, numpy_random_seed=0,
                                  torch_random_seed=0, fewshot_random_seed=0)
    return res["results"], {k: v.get("effective", v.get("original")) if isinstance(v, dict) else v
                            for k, v in (res.get("n-samples") or {}).items()}


def gate_scores(results: dict, n_samples: dict, tasks: dict[str, str], thresholds) -> dict:
    """Three gates: MC (size-weighted over subjects, plus unweighted mean), IF, GPQA."""
    mc = [t for t in tasks if "mmlu_pro" in t and t != "mmlu_pro"] or [t for t in results if t.startswith("mmlu_pro_")]
    out = {}
    key_mc = tasks.get(mc[0], "exact_match,custom-extract") if mc else "exact_match,custom-extract"
    subj = {t: results[t][key_mc] for t in mc if t in results and key_mc in results[t]}
    if "mmlu_pro" in results and key_mc in results["mmlu_pro"]:
        weighted = results["mmlu_pro"][key_mc]
    else:
        w = {t: n_samples.get(t, 1) or 1 for t in subj}
        weighted = sum(subj[t] * w[t] for t in subj) / max(1, sum(w.values()))
    out["mc"] = {"score": weighted, "unweighted_mean": sum(subj.values()) / max(1, len(subj)),
                 "threshold": thresholds[0], "pass": bool(weighted >= thresholds[0]), "subjects": subj}
    ift = next(t for t in tasks if "ifeval" in t)
    out["ifeval"] = {"score": results[ift]["inst_level_strict_acc,none"],
                     "prompt_level_strict_acc": results[ift]["prompt_level_strict_acc,none"],
                     "threshold": thresholds[1]}
    out["ifeval"]["pass"] = bool(out["ifeval"]["score"] >= thresholds[1])
    gt = next(t for t in tasks if "gpqa" in t)
    out["gpqa"] = {"score": results[gt]["exact_match,flexible-extract"], "threshold": thresholds[2]}
    out["gpqa"]["pass"] = bool(out["gpqa"]["score"] >= thresholds[2])
    return out


def run_evaluation(cfg: EvalConfig, out_dir, data_dir, qad_dir, finetune_dir, progress=True) -> EvalResult:
    t0 = time.time()
    out = start_run(out_dir, cfg, "06_evaluation")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    ensure_punkt_tab()
    from .models import resolve_target
    qm = read_json(Path(qad_dir) / "metrics.json")
    fp_spec = read_json(Path(data_dir) / "config.json")["target"]
    models = {"teacher": resolve_target(fp_spec)}
    models.update({k: str(Path(qad_dir) / qm["names"][k]) for k in ("rtn", "gptq", "qad")})
    if cfg.preset == "full":
        tasks, task_dir = dict(TASKS_FULL), None
        tasks.update({t: "exact_match,custom-extract" for t in []})
    else:
        task_dir = out / "tasks"
        tasks = write_local_tasks(task_dir, cfg)
    results, raw = {}, {}
    for name, path in models.items():
        res, n = _evaluate("hf", tasks, task_dir, cfg, f"pretrained={path},dtype=float32")
        raw[name] = res
        results[name] = gate_scores(res, n, tasks, cfg.thresholds)
    spec = {}
    if cfg.with_speculation and cfg.preset != "full":
        fm = read_json(Path(finetune_dir) / "metrics.json")
        drafter_dir = str(Path(finetune_dir) / fm["drafters"]["two_stage"])
        SpecLM = _spec_lm_class()
        plain = SpecLM(models["qad"], None, cfg.max_gen_toks)
        withd = SpecLM(models["qad"], drafter_dir, cfg.max_gen_toks)
        rp, n_p = _evaluate(plain, tasks, task_dir, cfg)
        rs, n_s = _evaluate(withd, tasks, task_dir, cfg)
        results["qad (our loop, plain)"] = gate_scores(rp, n_p, tasks, cfg.thresholds)
        results["qad (our loop, speculative)"] = gate_scores(rs, n_s, tasks, cfg.thresholds)
        lens = withd.accept_lengths
        spec = {"outputs": len(plain.outputs),
                "mismatched_outputs": sum(a != b for a, b in zip(plain.outputs, withd.outputs)),
                "tau": sum(lens) / max(1, len(lens))}
    (out / "lm_eval_results.json").write_text(json.dumps(raw, indent=1, default=str))
    m = finish_run(out, {"results": results, "speculation_check": spec, "tasks": tasks,
                         "thresholds": list(cfg.thresholds)}, t0)
    return EvalResult(out, m)
