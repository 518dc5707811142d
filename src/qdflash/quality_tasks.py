"""Local quality tasks that a 135M teacher can solve, so that "quality kept relative to BF16" is measurable offline.

The offline gate tasks (evaluation.py) keep the paper's formats, but at 135M parameters the teacher scores near
chance on them and every quantized model is "within noise". These two tasks are scored by log-likelihood (lm-eval
``multiple_choice``, metric ``acc``), hundreds of items each, generated deterministically offline:

* ``local_agreement``: grammatical minimal pairs (BLiMP-style: subject-verb agreement with and without an
  attractor noun, was/were, a/an); the model must prefer the grammatical sentence (chance 0.5).
* ``local_rg_products``: ``reasoning-gym``'s ``products`` problems, distinct questions, with four non-negative
  numeric options (chance 0.25); in a first probe SmolLM2-135M-Instruct was above chance here while its ``chain_sum``
  and ``leg_counting`` sat at chance.

Stage 06 scores those two (``EvalConfig.quality_tasks``). Four candidates of the same kinds (issue 35 item 5: more
tasks the teacher can do, so that a paired difference has the power to exclude zero) are in ``QUALITY_TASKS`` for a
run or benchmark that names them (``benchmarks/quality_tasks.py`` scores all six):

* ``local_number_agreement``: minimal pairs of other number and gender agreements: this/these and that/those with
  the noun, a reflexive with its antecedent (the other gender for a singular one, since "themselves" may take a
  singular antecedent), there is/are, has/have (chance 0.5). The teacher scores 0.98.
* ``local_rg_gcd``, ``local_rg_letter_counting``, ``local_rg_family``: reasoning-gym ``gcd`` (two numbers from 2 to
  40), ``letter_counting`` and ``family_relationships`` (answers that are one relation word), the answer among four
  options whose three distractors are other questions' answers (``exchangeable_items``), chance 0.25. The teacher
  does not clear the best rule that ignores the question (``value_rank_floor``) on any of them: it cannot do them.
  A first version drew the distractors at small offsets from the answer (gcd, letters) or from all relation words
  (family): the teacher scored 0.56 / 0.46 / 0.41 there, while one fixed slot of the sorted options scored 0.635 /
  0.645 / 0.28 on gcd / letters / family; the products task keeps such offsets, and its teacher clears that rule
  (0.53 against 0.42).

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
CHANCE = {"local_agreement": 0.5, "local_rg_products": 0.25, "local_number_agreement": 0.5, "local_rg_gcd": 0.25,
          "local_rg_letter_counting": 0.25, "local_rg_family": 0.25}
STAGE06_QUALITY_TASKS = ("local_agreement", "local_rg_products")      # EvalConfig.quality_tasks' default

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


def minimal_pairs(n: int, rng: random.Random, kinds: list[str], one) -> list[dict]:
    """``n`` distinct minimal pairs {"good", "bad", "kind"}, the ``kinds`` in turn; ``one(rng, k)`` makes a
    (grammatical, ungrammatical) pair of kind index ``k``."""
    rows, seen, tries = [], set(), 0
    while len(rows) < n:
        tries += 1
        if tries > 50 * n + 1000:
            raise ValueError(f"cannot make {n} distinct minimal pairs from the word lists")
        kind = len(rows) % len(kinds)
        good, bad = one(rng, kind)
        if good not in seen:
            seen.add(good)
            rows.append({"good": good, "bad": bad, "kind": kinds[kind]})
    return rows


def make_agreement(n: int, seed: int) -> list[dict]:
    """``n`` minimal pairs {"good", "bad", "kind"} of subject-verb agreement (with and without an attractor noun),
    was/were and a/an, four kinds in turn."""
    return minimal_pairs(n, random.Random(f"agreement-{seed}"), ["agreement", "attractor", "was_were", "a_an"],
                         _agreement_pair)


def _agreement_pair(rng: random.Random, kind: int) -> tuple[str, str]:
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
    return good, bad


_GENDERED = [("boy", "boys", "himself"), ("girl", "girls", "herself"), ("man", "men", "himself"),
             ("woman", "women", "herself"), ("king", "kings", "himself"), ("queen", "queens", "herself"),
             ("father", "fathers", "himself"), ("mother", "mothers", "herself"), ("brother", "brothers", "himself"),
             ("sister", "sisters", "herself"), ("actor", "actors", "himself"), ("actress", "actresses", "herself")]
_REFL_VERBS = ["hurt", "saw", "praised", "blamed", "washed", "introduced", "described", "helped"]
_THINGS = [("dog", "dogs"), ("cat", "cats"), ("book", "books"), ("car", "cars"), ("tree", "trees"),
           ("chair", "chairs"), ("apple", "apples"), ("box", "boxes"), ("child", "children"), ("mouse", "mice"),
           ("bird", "birds"), ("cup", "cups")]
_ANIMALS = [("dog", "dogs"), ("cat", "cats"), ("horse", "horses"), ("child", "children"), ("mouse", "mice"),
            ("bird", "birds"), ("farmer", "farmers"), ("teacher", "teachers"), ("student", "students"),
            ("baby", "babies")]
_SEE = ["I saw", "We bought", "She liked", "They found", "He wanted", "You painted"]
_WHERE = ["in the garden", "on the table", "near the door", "under the bed", "in the kitchen", "by the river"]
_HAVE = ["a red ball", "a new home", "many friends", "a long tail", "a big problem", "a good idea"]
_COUNT = ["two", "three", "four", "five", "many", "several"]


def make_number_agreement(n: int, seed: int) -> list[dict]:
    """``n`` minimal pairs {"good", "bad", "kind"} of number and gender agreement: determiner and noun, a reflexive
    and its antecedent, there is/are, has/have, four kinds in turn."""
    return minimal_pairs(n, random.Random(f"number-agreement-{seed}"),
                         ["determiner", "reflexive", "there_is_are", "has_have"], _number_pair)


def _number_pair(rng: random.Random, kind: int) -> tuple[str, str]:
    plural = rng.random() < 0.5
    if kind == 0:                       # determiner and noun: this/these, that/those
        sg, pl = rng.choice(_THINGS)
        near = rng.random() < 0.5
        d_sg, d_pl = ("this", "these") if near else ("that", "those")
        s = rng.choice(_SEE)
        noun = pl if plural else sg
        good, bad = f"{s} {d_pl if plural else d_sg} {noun}.", f"{s} {d_sg if plural else d_pl} {noun}."
    elif kind == 1:                     # reflexive and its antecedent
        sg, pl, refl = rng.choice(_GENDERED)
        v = rng.choice(_REFL_VERBS)
        if plural:
            good, bad = f"The {pl} {v} themselves.", f"The {pl} {v} {refl}."
        else:                           # the other gender (a singular antecedent may take "themselves")
            other = "herself" if refl == "himself" else "himself"
            good, bad = f"The {sg} {v} {refl}.", f"The {sg} {v} {other}."
    elif kind == 2:                     # existential there: is/are
        sg, pl = rng.choice(_THINGS)
        w = rng.choice(_WHERE)
        if plural:
            c = rng.choice(_COUNT)
            good, bad = f"There are {c} {pl} {w}.", f"There is {c} {pl} {w}."
        else:
            a = "an" if sg[0] in "aeiou" else "a"
            good, bad = f"There is {a} {sg} {w}.", f"There are {a} {sg} {w}."
    else:                               # has/have
        sg, pl = rng.choice(_ANIMALS)
        h = rng.choice(_HAVE)
        subj = pl if plural else sg
        good, bad = (f"The {subj} {'have' if plural else 'has'} {h}.",
                     f"The {subj} {'has' if plural else 'have'} {h}.")
    return good, bad


def _numeric_item(question: str, a: int, rng: random.Random, deltas: tuple[int, ...]) -> dict:
    """A multiple-choice row: the answer ``a`` among four sorted non-negative options, the others at ``deltas``."""
    opts = {a}
    while len(opts) < 4:
        o = a + rng.choice(deltas)
        if o >= 0:
            opts.add(o)
    opts = sorted(opts)
    return {"question": question, "choices": [str(o) for o in opts], "label": opts.index(a)}


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
            rows.append(_numeric_item(x["question"], int(x["answer"]), rng, (-3, -2, -1, 1, 2, 3, 10, -10)))
    if len(rows) < n:
        raise ValueError(f"reasoning-gym gave only {len(rows)} distinct products, not {n}")
    return rows


def _rg_questions(family: str, n: int, seed: int, keep=lambda answer: True, **kw) -> list[tuple[str, str]]:
    """``n`` distinct (question, answer) pairs of reasoning-gym ``family`` whose answer ``keep`` accepts."""
    import reasoning_gym as rg
    out, seen = [], set()
    for x in rg.create_dataset(family, size=8 * n, seed=seed + 11, **kw):
        if len(out) == n:
            break
        if x["question"] not in seen and keep(x["answer"]):
            seen.add(x["question"])
            out.append((x["question"], x["answer"]))
    if len(out) < n:
        raise ValueError(f"reasoning-gym gave only {len(out)} usable distinct {family} questions, not {n}")
    return out


def exchangeable_items(qa: list[tuple[str, str]], rng: random.Random, sort_key=None) -> list[dict]:
    """Multiple-choice rows, four sorted options each: the answer and three other values drawn from the answers of the
    other questions (by their frequency). Offsets around a small non-negative answer make it nearly always the smallest
    or second option (one fixed slot then scored 0.64 on gcd and letter counting); drawn from the answers' own values,
    a rule that ignores the question does less well, though not at chance (``value_rank_floor`` measures it)."""
    pool = [a for _, a in qa]
    if len(set(pool)) < 4:
        raise ValueError(f"fewer than four distinct answers ({sorted(set(pool))}): no four distinct options")
    rows = []
    for q, a in qa:
        opts = {a}
        while len(opts) < 4:
            opts.add(rng.choice(pool))
        opts = sorted(opts, key=sort_key)
        rows.append({"question": q, "choices": opts, "label": opts.index(a)})
    return rows


def value_rank_floor(rows: list[dict]) -> float:
    """The accuracy of the best rule that ignores the question and picks the k-th option of the sorted list (the
    smallest, the second, ...): a model scores each option alone, so such a rule stands for a prior over answer values
    (small numbers, one common word) that no question is needed for. The floor to read a score against, besides 1/4."""
    return max(sum(r["label"] == k for r in rows) for k in range(4)) / len(rows)


def make_rg_gcd(n: int, seed: int) -> list[dict]:
    """reasoning-gym ``gcd`` of two numbers from 2 to 40; distractors from the other questions' GCDs."""
    qa = _rg_questions("gcd", n, seed, min_numbers=2, max_numbers=2, min_value=2, max_value=40)
    return exchangeable_items(qa, random.Random(f"gcd-{seed}"), sort_key=int)


def make_rg_letter_counting(n: int, seed: int) -> list[dict]:
    """reasoning-gym ``letter_counting``; distractors from the other questions' counts."""
    qa = _rg_questions("letter_counting", n, seed)
    return exchangeable_items(qa, random.Random(f"letter_counting-{seed}"), sort_key=int)


_RELATIONS = {"husband", "wife", "mother", "father", "son", "daughter", "brother", "sister", "grandfather",
              "grandmother", "grandson", "granddaughter", "father-in-law", "mother-in-law", "son-in-law",
              "daughter-in-law", "uncle", "aunt"}


def make_rg_family(n: int, seed: int) -> list[dict]:
    """reasoning-gym ``family_relationships`` whose answer is one relation word of ``_RELATIONS``; distractors from
    the other questions' answers."""
    qa = _rg_questions("family_relationships", n, seed, keep=lambda a: a in _RELATIONS)
    return exchangeable_items(qa, random.Random(f"family-{seed}"))


# name -> (items: f(n, seed), kind): "pairs" rows {good, bad}, "question" rows {question, choices, label}
QUALITY_TASKS = {
    "local_agreement": (make_agreement, "pairs"),
    "local_rg_products": (make_products, "question"),
    "local_number_agreement": (make_number_agreement, "pairs"),
    "local_rg_gcd": (make_rg_gcd, "question"),
    "local_rg_letter_counting": (make_rg_letter_counting, "question"),
    "local_rg_family": (make_rg_family, "question"),
}


def task_data_file(task_dir: Path, task: str) -> Path:
    """Where ``write_quality_tasks`` puts a task's items (JSONL) in ``task_dir``."""
    return task_dir / f"{task.removeprefix('local_')}.jsonl"


def write_quality_tasks(task_dir: Path, n: int, seed: int = 0,
                        tasks: tuple[str, ...] = STAGE06_QUALITY_TASKS) -> dict[str, str]:
    """Data and lm-eval YAMLs of ``tasks`` (names in ``QUALITY_TASKS``), ``n`` items each, in ``task_dir``; returns
    {task: metric}."""
    unknown = [t for t in tasks if t not in QUALITY_TASKS]
    if unknown:
        raise ValueError(f"unknown quality tasks {unknown}: choose from {sorted(QUALITY_TASKS)}")
    task_dir.mkdir(parents=True, exist_ok=True)
    common = """output_type: multiple_choice
test_split: test
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""
    for task in tasks:
        make, kind = QUALITY_TASKS[task]
        data = task_data_file(task_dir, task)
        write_jsonl(data, make(n, seed))
        if kind == "pairs":             # the grammatical sentence against its minimal pair, as the whole reply
            body = 'doc_to_text: ""\ndoc_to_choice: "{{[good, bad]}}"\ndoc_to_target: 0\ntarget_delimiter: ""\n'
        else:
            body = ('doc_to_text: "Question: {{question}}\\nAnswer:"\ndoc_to_choice: "{{choices}}"\n'
                    'doc_to_target: label\n')
        (task_dir / f"{task}.yaml").write_text(f"task: {task}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
                                               f"    test: {data}\n{body}{common}")
    return {t: ACC for t in tasks}


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
