"""The log-likelihood quality tasks of stage 06 (quality_tasks): the lm-eval wiring scores an oracle 1.0 and an
anti-oracle 0.0 (a swapped label or a wrong choice list would not), and the fractions of the teacher's score."""
import math
import re

import pytest

from qdflash.quality_tasks import (CHANCE, QUALITY_TASKS, STAGE06_QUALITY_TASKS, exchangeable_items, make_agreement,
                                   make_number_agreement, make_products, make_rg_family, make_rg_gcd,
                                   make_rg_letter_counting, paired_between, relative_to_teacher, value_rank_floor,
                                   write_quality_tasks)


def _oracle_lm(right: bool):
    from lm_eval.api.model import LM

    goods, answers = set(), {}            # the pairs' grammatical sentences; question -> right answer (other tasks)

    class Oracle(LM):
        def loglikelihood(self, requests, disable_tqdm=False):
            out = []
            for r in requests:
                ctx, cont = r.args
                if ctx.strip() == "" or ctx == " ":
                    ok = cont.strip() in goods
                elif re.search(r"(\d+) \* (\d+)", ctx):       # products: computed, not looked up
                    a, b = map(int, re.search(r"(\d+) \* (\d+)", ctx).groups())
                    ok = cont.strip() == str(a * b)
                else:
                    q = ctx.split("Question: ", 1)[1].rsplit("\nAnswer:", 1)[0]
                    ok = cont.strip() == answers[q]
                out.append(((0.0 if ok == right else -10.0), False))
            return out

        def loglikelihood_rolling(self, requests, disable_tqdm=False):
            raise NotImplementedError

        def generate_until(self, requests, disable_tqdm=False):
            raise NotImplementedError

    return Oracle(), goods, answers


@pytest.mark.parametrize("right", [True, False])
def test_lm_eval_scores_an_oracle_right(tmp_path, right):
    """Every task of QUALITY_TASKS: the oracle (the right choice most likely) scores 1.0, the anti-oracle 0.0."""
    import lm_eval
    from lm_eval.tasks import TaskManager
    tasks = write_quality_tasks(tmp_path, 12, tasks=tuple(QUALITY_TASKS))
    assert set(tasks) == set(QUALITY_TASKS) == set(CHANCE)
    lm, goods, answers = _oracle_lm(right)
    for t, (make, kind) in QUALITY_TASKS.items():
        rows = make(12, 0)
        goods.update(r["good"] for r in rows if kind == "pairs")
        answers.update((r["question"], r["choices"][r["label"]]) for r in rows if kind == "question")
    res = lm_eval.simple_evaluate(model=lm, tasks=list(tasks), task_manager=TaskManager(include_path=str(tmp_path)))
    for t in tasks:
        assert res["results"][t]["acc,none"] == (1.0 if right else 0.0), t


def test_stage06_writes_its_two_tasks_unless_told_and_refuses_unknown_ones(tmp_path):
    assert tuple(write_quality_tasks(tmp_path / "a", 4)) == STAGE06_QUALITY_TASKS
    assert sorted(p.name for p in (tmp_path / "a").glob("*.yaml")) == sorted(f"{t}.yaml" for t in STAGE06_QUALITY_TASKS)
    with pytest.raises(ValueError, match="unknown quality tasks"):
        write_quality_tasks(tmp_path / "b", 4, tasks=("local_nope",))
    from qdflash.config import EvalConfig, load_config
    assert load_config(EvalConfig, "smol").quality_tasks == STAGE06_QUALITY_TASKS


def test_the_added_tasks_are_distinct_deterministic_and_well_formed():
    na = make_number_agreement(200, 0)
    assert na == make_number_agreement(200, 0) and na != make_number_agreement(200, 1)
    assert len({r["good"] for r in na}) == 200 and all(r["good"] != r["bad"] for r in na)
    assert {r["kind"] for r in na} == {"determiner", "reflexive", "there_is_are", "has_have"}
    # a singular antecedent's bad reflexive is the other gender, never "themselves" (singular they is grammatical)
    assert not any(r["kind"] == "reflexive" and r["bad"].endswith("themselves.") for r in na)
    assert not any(re.search(r"\ba [aeiou]", r["good"]) for r in na)      # "an apple": only the agreement is wrong
    for rows in (make_rg_gcd(400, 0), make_rg_letter_counting(400, 0), make_rg_family(400, 0)):
        assert len({r["question"] for r in rows}) == 400
        assert all(len(set(r["choices"])) == 4 and 0 <= r["label"] < 4 for r in rows)
        # every slot holds the answer often: no rule that picks one slot of the sorted options comes near 0.5
        assert value_rank_floor(rows) < 0.42
    for r in make_rg_gcd(400, 0):           # the labelled choice is the GCD of the question's two numbers
        a, b = map(int, re.search(r"numbers: (\d+), (\d+)", r["question"]).groups())
        assert int(r["choices"][r["label"]]) == math.gcd(a, b)
    for r in make_rg_letter_counting(400, 0):   # ... the count of the letter in the quoted text, either case
        letter, text = re.search(r'letter "(.)" appear in the text: "(.*)"\?', r["question"], re.S).groups()
        assert int(r["choices"][r["label"]]) == text.lower().count(letter.lower())


def test_exchangeable_items_label_the_answer_among_other_answers_and_the_floor_reads_the_slots():
    import random
    qa = [(f"q{i}", str(i % 6)) for i in range(60)]
    rows = exchangeable_items(qa, random.Random(0), sort_key=int)
    assert all(r["choices"][r["label"]] == a for r, (_, a) in zip(rows, qa))
    assert all(r["choices"] == sorted(r["choices"], key=int) and set(r["choices"]) <= {str(k) for k in range(6)}
               for r in rows)
    with pytest.raises(ValueError, match="fewer than four distinct answers"):
        exchangeable_items([("a", "1"), ("b", "2"), ("c", "3")], random.Random(0))
    assert value_rank_floor([{"label": 0}] * 3 + [{"label": 2}]) == 0.75


def test_items_are_distinct_deterministic_and_mixed():
    a = make_agreement(200, 0)
    assert a == make_agreement(200, 0) and a != make_agreement(200, 1)
    assert len({r["good"] for r in a}) == 200 and all(r["good"] != r["bad"] for r in a)
    assert {r["kind"] for r in a} == {"agreement", "attractor", "was_were", "a_an"}
    p = make_products(150, 0)                 # more than the ~80 one-digit products: no question repeats
    assert len({r["question"] for r in p}) == 150
    assert all(len(set(r["choices"])) == 4 and min(int(c) for c in r["choices"]) >= 0 for r in p)
    labels = [r["label"] for r in p]
    assert len(set(labels)) > 1            # the answer is not always in the same slot


def test_fraction_of_teacher_is_paired():
    items = {"teacher": {"t": [1, 1, 0, 1, 1, 0] * 5}, "qad": {"t": [1, 0, 0, 1, 1, 0] * 5}}
    r = relative_to_teacher(items)["qad"]["t"]
    assert r["fraction_of_teacher"] == pytest.approx(3 / 4)
    assert r["diff"] == pytest.approx(-1 / 6)
    assert r["fraction_ci95"][0] <= 3 / 4 <= r["fraction_ci95"][1] <= 1.0
    assert "teacher" not in relative_to_teacher(items)


def test_qad_against_gptq_is_paired_over_the_same_items():
    """QAD right on 30 more of 200 items than GPTQ, the rest equal: the paired difference is +0.15 with an interval that
    excludes 0 (the items' shared difficulty cancels); a model scored on other items is not paired."""
    import random
    rng = random.Random(0)
    hard = [rng.random() < 0.5 for _ in range(200)]
    gptq = [0.0 if h else 1.0 for h in hard]
    qad = list(gptq)
    flips = [i for i, g in enumerate(gptq) if g == 0.0][:30]
    for i in flips:
        qad[i] = 1.0
    p = paired_between({"qad": {"t": qad}, "gptq": {"t": gptq}, "rtn": {"t": gptq[:100]}})
    d = p["qad - gptq"]["t"]
    lo, hi = d["diff_ci95"]
    assert d["diff"] == pytest.approx(0.15) and lo > 0.09 and d["items"] == 200
    assert hi - lo < 0.12                   # unpaired (two independent proportions) it would be ~0.19 wide
    assert d["a"] - d["b"] == pytest.approx(d["diff"])
    assert "qad - rtn" not in p
    z = paired_between({"qad": {"t": [0.0] * 8}, "gptq": {"t": [0.0] * 8}})["qad - gptq"]["t"]   # tiny: no item right
    assert z["diff"] == 0.0 and z["diff_ci95"] == [0.0, 0.0]


def test_the_benchmark_table_and_summary_read_the_paired_differences(tmp_path):
    """A hand-made benchmarks/quality_tasks.py output: the row of each task shows its own models' numbers, and the
    summary lists a task under "above" or "below" only where the paired interval excludes zero on that side."""
    import json

    from qdflash.gpu_results import quality_tasks_summary, quality_tasks_table
    tasks = ["local_agreement", "local_rg_gcd", "local_rg_family"]
    acc = {"teacher": 0.9, "rtn": 0.7, "gptq": 0.8, "qad": 0.85}
    scores = {m: {t: {"acc": a + 0.01 * i, "acc_ci95": [a - 0.05, a + 0.05], "items": 400} for i, t in enumerate(tasks)}
              for m, a in acc.items()}
    d = lambda x, lo, hi: {"diff": x, "diff_ci95": [lo, hi], "a": 0, "b": 0, "items": 400}      # noqa: E731
    out = {"tasks": tasks + ["local_rg_products"], "chance": {t: CHANCE[t] for t in tasks + ["local_rg_products"]},
           "stage06_tasks": ["local_agreement"], "value_rank_floor": {"local_rg_gcd": 0.3, "local_rg_products": 0.9},
           "dtype": "bfloat16", "provenance": {"git_sha": "abc123", "cpu": {"model": "Test CPU"}},
           "stage01_git_sha": "def456", "stage01_cpu": "Test CPU", "scores": scores,
           "vs_teacher": {"qad": {t: {"fraction_of_teacher": 0.94, "fraction_ci95": [0.9, 0.98]} for t in tasks}},
           "paired": {"qad - gptq": {"local_agreement": d(-0.04, -0.07, -0.02), "local_rg_gcd": d(0.05, 0.01, 0.09),
                                     "local_rg_family": d(0.01, -0.02, 0.04)},
                      "qad - rtn": {t: d(0.1, 0.05, 0.15) for t in tasks}}}
    for m in acc:                       # a task whose teacher sits at its question-blind rule: left out of the counts
        scores[m]["local_rg_products"] = {"acc": 0.88, "acc_ci95": [0.85, 0.91], "items": 400}
    out["vs_teacher"]["qad"]["local_rg_products"] = {"fraction_of_teacher": 1.0, "fraction_ci95": [0.95, 1.05]}
    for k in out["paired"]:
        out["paired"][k]["local_rg_products"] = d(0.2, 0.1, 0.3)
    path = tmp_path / "q.json"
    path.write_text(json.dumps(out))
    tab = quality_tasks_table(path)
    assert list(tab.index) == ["local_agreement (stage 06)", "local_rg_gcd", "local_rg_family", "local_rg_products"]
    assert tab.loc["local_rg_gcd", "best question-blind rule"] == 0.3 and tab.loc["local_rg_family", "best question-blind rule"] == ""
    assert tab.loc["local_rg_gcd", "gptq acc"].startswith("0.810 ")
    assert tab.loc["local_agreement (stage 06)", "QAD minus GPTQ (paired)"] == "-0.040 (-0.070–-0.020)"
    assert tab.loc["local_rg_family", "chance"] == 0.25
    s = quality_tasks_summary(path)
    assert ("QAD minus GPTQ excludes zero on 2 of 3 tasks: above on `local_rg_gcd`, below on `local_agreement`."
            in s)
    assert "QAD minus RTN excludes zero on 3 of 3 tasks" in s and "Test CPU" in s and "`abc123`" in s
    assert "Left out: `local_rg_products`" in s


def test_stage06_task_files_are_byte_for_byte_what_the_committed_results_used(tmp_path):
    """The YAMLs of stage 06's two tasks as the committed `results/smol` run wrote them (a changed delimiter, prompt or
    target would change what the scores mean)."""
    write_quality_tasks(tmp_path, 4)
    tail = ("output_type: multiple_choice\ntest_split: test\nmetric_list:\n  - metric: acc\n    aggregation: mean\n"
            "    higher_is_better: true\n")
    assert (tmp_path / "local_agreement.yaml").read_text() == (
        f"task: local_agreement\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {tmp_path}/agreement.jsonl\n"
        'doc_to_text: ""\ndoc_to_choice: "{{[good, bad]}}"\ndoc_to_target: 0\ntarget_delimiter: ""\n' + tail)
    assert (tmp_path / "local_rg_products.yaml").read_text() == (
        f"task: local_rg_products\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {tmp_path}/rg_products.jsonl\n"
        'doc_to_text: "Question: {{question}}\\nAnswer:"\ndoc_to_choice: "{{choices}}"\ndoc_to_target: label\n' + tail)
