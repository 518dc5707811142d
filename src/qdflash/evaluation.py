"""Stage 06: quality gates with lm-eval.

``full``: the real tasks as the paper's harness runs them (reference/paper.md, section 1.7): ``mmlu_pro`` (5-shot,
exact_match custom-extract; the gate is the *unweighted* mean over the 14 subjects, lm-eval's size-weighted group
score is kept next to it) and ``ifeval`` (prompt-level strict acc; inst-level strict kept next to it) with thinking
off, ``gpqa_diamond_cot_zeroshot`` (flexible-extract) with thinking on, on the hf backend, with the competition
thresholds 0.621 / 0.814 / 0.630 as pass/fail. Every backend generates at most ``EvalConfig.max_gen_toks`` tokens
and loads the models in ``EvalConfig.dtype``. Every gate score carries a 95% bootstrap interval over items
(``score_ci95``; stratified by subject for the MMLU-Pro mean).

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
from pathlib import Path

from .config import EvalConfig
from .decode_stats import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED
from .runio import cache_dir, device, write_jsonl

MC_METRIC, IF_METRIC, GPQA_METRIC = ("exact_match,custom-extract", "prompt_level_strict_acc,none",
                                     "exact_match,flexible-extract")
TASKS_FULL = {"mmlu_pro": MC_METRIC, "ifeval": IF_METRIC, "gpqa_diamond_cot_zeroshot": GPQA_METRIC}
THINKING_FULL = {"mmlu_pro": False, "ifeval": False, "gpqa_diamond_cot_zeroshot": True}   # as the paper sets it
THINK_END = "</think>"          # Qwen3.5's end of reasoning: lm-eval strips everything before it when thinking
LETTERS = "ABCDEFGHIJ"


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
        tasks[name] = MC_METRIC
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
    tasks["local_ifeval"] = IF_METRIC
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
    tasks["local_gpqa"] = GPQA_METRIC
    return tasks


# ----------------------------------------------------------------------------------------------- lm-eval glue
def spec_lm_class():
    from lm_eval.api.model import LM

    class SpecLM(LM):
        """lm-eval generate_until through the reference (speculative) decoder, batch 1, greedy."""

        def __init__(self, target_dir: str, drafter_dir: str | None = None, max_gen_toks: int = 256,
                     dtype: str = "float32"):
            super().__init__()
            from transformers import AutoTokenizer

            from .drafter import load_drafter
            from .models import load_model
            from .runio import torch_dtype
            self.tok = AutoTokenizer.from_pretrained(target_dir)
            self.model = load_model(target_dir, dtype)
            self.drafter = load_drafter(drafter_dir, torch_dtype(dtype)) if drafter_dir else None
            self.max_gen_toks = max_gen_toks
            self.outputs: list[str] = []
            self.results: list = []          # one speculative.GenResult per request
            self.prompt_ids: list[list[int]] = []   # the tokens each request's generation started from

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
                self.results.append(r)
                self.prompt_ids.append(ids)
                out.append(text)
            self.outputs += out
            return out

        def loglikelihood(self, requests, disable_tqdm: bool = False):
            raise NotImplementedError("SpecLM only serves generate_until tasks")

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
            raise NotImplementedError("SpecLM only serves generate_until tasks")

    return SpecLM


def task_groups(cfg: EvalConfig, tasks: dict[str, str]) -> list[tuple[bool | None, dict[str, str]]]:
    """The lm-eval runs of one model: ``full`` splits its tasks by the paper's thinking setting (one run with
    thinking off, one with it on); the offline presets' small models have no thinking mode (one run, None)."""
    if cfg.preset != "full":
        return [(None, dict(tasks))]
    unknown = sorted(set(tasks) - set(THINKING_FULL))
    if unknown:
        raise ValueError(f"no thinking setting for task(s) {unknown}; known: {sorted(THINKING_FULL)}")
    return [(th, {t: m for t, m in tasks.items() if THINKING_FULL[t] == th})
            for th in (False, True) if any(THINKING_FULL[t] == th for t in tasks)]


def hf_model_args(path: str, cfg: EvalConfig, thinking: bool | None) -> str:
    """lm-eval ``hf`` model_args: the preset's dtype and, where set, the chat template's thinking switch."""
    args = f"pretrained={path},dtype={cfg.dtype}"
    if thinking is not None:
        args += f",enable_thinking={thinking}" + (f",think_end_token={THINK_END}" if thinking else "")
    return args


def _evaluate(model, tasks: dict[str, str], task_dir: Path | None, cfg: EvalConfig, model_args: str | None = None):
    """One lm-eval run; returns (results, effective n-samples, logged samples by task). Generation is capped at
    ``cfg.max_gen_toks`` on every backend (it overrides the tasks' own ``generation_kwargs``)."""
    import lm_eval
    from lm_eval.tasks import TaskManager
    tm = TaskManager(include_path=str(task_dir)) if task_dir else TaskManager()
    res = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=list(tasks), task_manager=tm,
                                  batch_size=cfg.batch_size, device=device(), apply_chat_template=True,
                                  gen_kwargs={"max_gen_toks": cfg.max_gen_toks},
                                  limit=None, log_samples=True, random_seed=0, numpy_random_seed=1234,
                                  torch_random_seed=1234, fewshot_random_seed=0)    # the paper harness's seeds
    n = {k: v.get("effective", v.get("original")) if isinstance(v, dict) else v
         for k, v in (res.get("n-samples") or {}).items()}
    return res["results"], n, res.get("samples") or {}


def item_scores(samples: dict, task: str, metric_key: str) -> list[float]:
    """Per-item values of ``metric,filter`` from lm-eval's logged samples of ``task`` (document order)."""
    metric, _, filt = metric_key.partition(",")
    rows = [s for s in samples.get(task, []) if s.get("filter", "none") == (filt or "none") and metric in s]
    return [float(s[metric]) for s in sorted(rows, key=lambda s: s["doc_id"])]


def bootstrap_mean_ci(strata: list[list[float]], resamples: int = BOOTSTRAP_RESAMPLES,
                      seed: int = BOOTSTRAP_SEED) -> list[float]:
    """95% percentile bootstrap interval of the unweighted mean of per-stratum means, items resampled with
    replacement within each stratum (one stratum: the plain mean over items)."""
    import numpy as np
    strata = [np.asarray(x, dtype=np.float64) for x in strata if len(x)]
    if not strata:
        return [float("nan"), float("nan")]
    rng = np.random.default_rng(seed)
    means = np.mean([x[rng.integers(0, len(x), size=(resamples, len(x)))].mean(1) for x in strata], axis=0)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return [float(lo), float(hi)]


def gate_scores(results: dict, n_samples: dict, tasks: dict[str, str], thresholds, samples: dict | None = None) -> dict:
    """The three gates the way the paper's harness computes them: MC = the unweighted mean over subjects (the
    size-weighted score is kept as ``size_weighted``), IFEval = prompt-level strict accuracy (inst-level strict kept
    as ``inst_level_strict_acc``), GPQA = flexible-extract exact match. With lm-eval's logged samples each score
    gets a 95% bootstrap interval over items (``score_ci95``)."""
    samples = samples or {}
    mc = sorted(t for t in results if "mmlu_pro_" in t)
    if not mc:
        raise ValueError(f"no MMLU-Pro subject results among {sorted(results)}")
    subj = {t: results[t][MC_METRIC] for t in mc}
    w = {t: n_samples.get(t, 1) or 1 for t in subj}
    weighted = sum(subj[t] * w[t] for t in subj) / sum(w.values())
    score = sum(subj.values()) / len(subj)
    out = {"mc": {"score": score, "size_weighted": weighted, "subjects": subj, "threshold": thresholds[0],
                  "pass": bool(score >= thresholds[0])}}
    per_subject = [item_scores(samples, t, MC_METRIC) for t in mc]
    if all(per_subject):
        out["mc"]["score_ci95"] = bootstrap_mean_ci(per_subject)
    ift = next(t for t in tasks if "ifeval" in t)
    out["ifeval"] = {"score": results[ift][IF_METRIC],
                     "inst_level_strict_acc": results[ift].get("inst_level_strict_acc,none"),
                     "threshold": thresholds[1], "pass": bool(results[ift][IF_METRIC] >= thresholds[1])}
    gt = next(t for t in tasks if "gpqa" in t)
    out["gpqa"] = {"score": results[gt][GPQA_METRIC], "threshold": thresholds[2],
                   "pass": bool(results[gt][GPQA_METRIC] >= thresholds[2])}
    for gate, task, key in (("ifeval", ift, IF_METRIC), ("gpqa", gt, GPQA_METRIC)):
        items = item_scores(samples, task, key)
        if items:
            out[gate]["score_ci95"] = bootstrap_mean_ci([items])
            out[gate]["items"] = len(items)
    return out


def _compressed(path: str | None) -> bool:
    """A compressed-tensors checkpoint (the RTN / GPTQ / QAD W4A16 targets)."""
    cfg = Path(path or "") / "config.json"
    if not path or not cfg.exists():
        return False
    return (json.loads(cfg.read_text()).get("quantization_config") or {}).get("quant_method") == "compressed-tensors"


def _dense_hflm(path: str, cfg: EvalConfig, thinking: bool | None):
    """lm-eval's ``hf`` backend over the checkpoint de-quantized once (``models.load_model``: exact codes x scales,
    the same logits) instead of transformers' compressed modules, which de-quantize on every forward. The model
    arguments are those of ``hf_model_args``; tests/test_evaluation.py checks the per-item responses are identical."""
    from lm_eval.models.huggingface import HFLM

    from .models import load_model, load_tokenizer
    kw = {"enable_thinking": thinking} if thinking is not None else {}
    if thinking:
        kw["think_end_token"] = THINK_END
    return HFLM(pretrained=load_model(path, cfg.dtype), tokenizer=load_tokenizer(path), batch_size=cfg.batch_size,
                **kw)


def evaluate_model(model, tasks, task_dir, cfg: EvalConfig, path: str | None = None):
    """All task groups of one model (hf backend when ``path`` is given, else the LM instance ``model``); a
    compressed checkpoint is evaluated de-quantized (``_dense_hflm``)."""
    results, n, samples = {}, {}, {}
    for thinking, group in task_groups(cfg, tasks):
        if path and _compressed(path):
            r, k, s = _evaluate(_dense_hflm(path, cfg, thinking), group, task_dir, cfg)
        else:
            r, k, s = _evaluate(model, group, task_dir, cfg, hf_model_args(path, cfg, thinking) if path else None)
        results.update(r)
        n.update(k)
        samples.update(s)
    return results, n, samples
