"""Local quality tasks that a 135M teacher can solve, so that "quality kept relative to BF16" is measurable offline.

The offline gate tasks (evaluation.py) keep the paper's formats, but at 135M parameters the teacher scores near
chance on them and every quantized model is "within noise". These two tasks are scored by log-likelihood (lm-eval
``multiple_choice``, metric ``acc``), hundreds of items each, generated deterministically offline:

* ``local_agreement``: grammatical minimal pairs (BLiMP-style: subject-verb agreement with and without an
  attractor noun, was/were, a/an); the model must prefer the grammatical sentence (chance 0.5).
* ``local_rg_products``: ``reasoning-gym``'s ``products`` problems, distinct questions, with four non-negative
  numeric options (chance 0.25); in a first probe SmolLM2-135M-Instruct was above chance here while its ``chain_sum``
  and ``leg_counting`` sat at chance.

Stage 06 scores them like every task of the run, through the model's chat template: each sentence or answer is
the assistant's reply, so ``local_agreement`` measures which reply the model prefers, not unconditional sentence
probability.

Each quantized model's score is reported as a fraction of the teacher's, raw and above chance
((acc - chance) / (teacher - chance)), with paired bootstrap intervals over items (the same items for both models).
"""
from __future__ import annotations

import random
from pathlib import Path

from .runio import write_jsonl

ACC = "acc,none"
CHANCE = {"local_agreement": 0.5, "local_rg_products": 0.25}

_NOUNS = [("dog", "dogs"), ("cat", "cats"), ("teacher", "teachers"), ("child", "children"), ("woman", "women"),
          ("man", "men"), ("student", "students"), ("bird", "birds"), ("doctor", "doctors"), ("farmer", "farmers"),
          ("girl", "girls"), ("boy", "boys"), ("baby", "babies"), ("friend", "friends"), ("neighbor", "neighbors"),
          ("king", "kings"), ("mouse", "mice"), ("horse", "horses"), ("driver", "drivers"), ("artist", "artists")]
_VERBS = [("runs", "run", "in the park"), ("sleeps", "sleep", "on the sofa"), ("sings", "sing", "every morning"),
          ("eats", "eat", "a sandwich"), ("reads", "read", "a book"), ("walks", "walk", "to school"),
          ("plays", "play", "outside"), ("laughs", "laugh", "loudly"), ("writes", "write", "a letter"),
          ("swims", "swim", "in the lake"), ("likes", "like", "the music"), ("wants", "want", "some water")]
_PLACES = ["house", "tree", "car", "table", "window", "river", "garden", "bridge"]
_VOWEL = ["apple", "orange", "egg", "onion", "umbrella", "elephant", "owl", "island", "engine", "idea"]
_CONSONANT = ["banana", "car", "dog", "book", "pencil", "table", "cup", "hat", "river", "song"]
_SUBJ = ["She", "He", "My friend", "The girl", "Our teacher"]
_SEEN = ["saw", "found", "wanted", "drew", "bought"]
_ADJ = ["happy", "tired", "late", "hungry", "busy", "quiet"]
_WHEN = ["yesterday", "last night", "this morning", "on Monday"]


def make_agreement(n: int, seed: int) -> list[dict]:
    """``n`` minimal pairs {"good", "bad", "kind"}, four kinds in turn."""
    rng = random.Random(f"agreement-{seed}")
    rows, seen, tries = [], set(), 0
    while len(rows) < n:
        tries += 1
        if tries > 50 * n + 1000:
            raise ValueError(f"cannot make {n} distinct minimal pairs from the word lists")
        kind = len(rows) % 4
        sg, pl = rng.choice(_NOUNS)
        v3, vp, compl = rng.choice(_VERBS)
        plural = rng.random() < 0.5
        subj = pl if plural else sg
        if kind == 0:
            good, bad = (f"The {subj} {vp if plural else v3} {compl}.", f"The {subj} {v3 if plural else vp} {compl}.")
        elif kind == 1:                 # an attractor of the other number between subject and verb
            other = rng.choice(_PLACES) + ("" if plural else "s")
            good = f"The {subj} near the {other} {vp if plural else v3} {compl}."
            bad = f"The {subj} near the {other} {v3 if plural else vp} {compl}."
        elif kind == 2:
            rest = f"{rng.choice(_ADJ)} {rng.choice(_WHEN)}"
            good, bad = (f"The {subj} {'were' if plural else 'was'} {rest}.",
                         f"The {subj} {'was' if plural else 'were'} {rest}.")
        else:
            s, v = rng.choice(_SUBJ), rng.choice(_SEEN)
            if rng.random() < 0.5:
                w = rng.choice(_VOWEL)
                good, bad = f"{s} {v} an {w}.", f"{s} {v} a {w}."
            else:
                w = rng.choice(_CONSONANT)
                good, bad = f"{s} {v} a {w}.", f"{s} {v} an {w}."
        if good in seen:
            continue
        seen.add(good)
        rows.append({"good": good, "bad": bad, "kind": ["agreement", "attractor", "was_were", "a_an"][kind]})
    return rows


def make_products(n: int, seed: int) -> list[dict]:
    """``n`` distinct products (reasoning-gym ``products``: one-digit by one-digit, then up to two digits by one once
    the ~80 one-digit questions are used up) with the answer among four non-negative nearby numbers."""
    import reasoning_gym as rg
    rng = random.Random(f"products-{seed}")
    rows, seen = [], set()
    for k, digits in enumerate((1, 2, 2, 2, 2)):
        ds = rg.create_dataset("products", size=4 * n, seed=seed + 3 + k, min_terms=2, max_terms=2,
                               min_digits=1, max_digits=digits)
        for x in ds:
            if x["question"] in seen or len(rows) == n:
                continue
            seen.add(x["question"])
            a = int(x["answer"])
            opts = {a}
            while len(opts) < 4:
                o = a + rng.choice([-3, -2, -1, 1, 2, 3, 10, -10])
                if o >= 0:
                    opts.add(o)
            opts = sorted(opts)
            rows.append({"question": x["question"], "choices": [str(o) for o in opts], "label": opts.index(a)})
    if len(rows) < n:
        raise ValueError(f"reasoning-gym gave only {len(rows)} distinct products, not {n}")
    return rows


def write_quality_tasks(task_dir: Path, n: int, seed: int = 0) -> dict[str, str]:
    """Data and lm-eval YAMLs of both tasks in ``task_dir``; returns {task: metric}."""
    task_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(task_dir / "agreement.jsonl", make_agreement(n, seed))
    write_jsonl(task_dir / "rg_products.jsonl", make_products(n, seed))
    common = """output_type: multiple_choice
test_split: test
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""
    (task_dir / "local_agreement.yaml").write_text(f"""task: local_agreement
dataset_path: json
dataset_kwargs:
  data_files:
    test: {task_dir / 'agreement.jsonl'}
doc_to_text: ""
doc_to_choice: "{{{{[good, bad]}}}}"
doc_to_target: 0
target_delimiter: ""
{common}""")
    (task_dir / "local_rg_products.yaml").write_text(f"""task: local_rg_products
dataset_path: json
dataset_kwargs:
  data_files:
    test: {task_dir / 'rg_products.jsonl'}
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
{common}""")
    return {"local_agreement": ACC, "local_rg_products": ACC}


def relative_to_teacher(item_acc: dict[str, dict[str, list[float]]], teacher: str = "teacher") -> dict:
    """{model: {task: score / teacher's score with a paired bootstrap 95% interval over items}}."""
    from .qad import bootstrap_ratio_diff
    out: dict = {}
    for model, tasks in item_acc.items():
        if model == teacher:
            continue
        for task, acc in tasks.items():
            ref = item_acc[teacher][task]
            if len(acc) != len(ref) or not acc or sum(ref) == 0:
                continue
            r = bootstrap_ratio_diff(acc, ref, [1] * len(acc))
            c = CHANCE.get(task, 0.0)
            rc = bootstrap_ratio_diff([x - c for x in acc], [x - c for x in ref], [1] * len(acc))
            out.setdefault(model, {})[task] = {"fraction_of_teacher": r["ratio"], "fraction_ci95": r["ratio_ci95"],
                                               "above_chance_fraction": rc["ratio"],
                                               "above_chance_ci95": rc["ratio_ci95"],
                                               "diff": r["diff"], "diff_ci95": r["diff_ci95"], "items": len(acc)}
    return out


def paired_between(item_acc: dict[str, dict[str, list[float]]],
                   pairs: tuple[tuple[str, str], ...] = (("qad", "gptq"), ("qad", "rtn"))) -> dict:
    """{"a - b": {task: score of a minus score of b, with a paired bootstrap 95% interval over the same items}} for
    every pair whose two models were scored on the same items (the paper's question: does QAD keep more than PTQ)."""
    from .qad import bootstrap_ratio_diff
    out: dict = {}
    for a, b in pairs:
        for task, acc in (item_acc.get(a) or {}).items():
            ref = (item_acc.get(b) or {}).get(task)
            if not ref or len(acc) != len(ref):
                continue
            r = bootstrap_ratio_diff(acc, ref, [1] * len(acc))
            out.setdefault(f"{a} - {b}", {})[task] = {"diff": r["diff"], "diff_ci95": r["diff_ci95"],
                                                       "a": sum(acc) / len(acc), "b": sum(ref) / len(ref),
                                                       "items": len(acc)}
    return out
