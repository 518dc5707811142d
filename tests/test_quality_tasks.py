"""The log-likelihood quality tasks of stage 06 (quality_tasks): the lm-eval wiring scores an oracle 1.0 and an
anti-oracle 0.0 (a swapped label or a wrong choice list would not), and the fractions of the teacher's score."""
import re

import pytest

from qdflash.quality_tasks import (make_agreement, make_products, paired_between, relative_to_teacher,
                                   write_quality_tasks)


def _oracle_lm(right: bool):
    from lm_eval.api.model import LM

    goods = set()

    class Oracle(LM):
        def loglikelihood(self, requests, disable_tqdm=False):
            out = []
            for r in requests:
                ctx, cont = r.args
                if ctx.strip() == "" or ctx == " ":
                    ok = cont.strip() in goods
                else:
                    a, b = map(int, re.search(r"(\d+) \* (\d+)", ctx).groups())
                    ok = cont.strip() == str(a * b)
                out.append(((0.0 if ok == right else -10.0), False))
            return out

        def loglikelihood_rolling(self, requests, disable_tqdm=False):
            raise NotImplementedError

        def generate_until(self, requests, disable_tqdm=False):
            raise NotImplementedError

    return Oracle(), goods


@pytest.mark.parametrize("right", [True, False])
def test_lm_eval_scores_an_oracle_right(tmp_path, right):
    import lm_eval
    from lm_eval.tasks import TaskManager
    tasks = write_quality_tasks(tmp_path, 12)
    lm, goods = _oracle_lm(right)
    goods.update(r["good"] for r in make_agreement(12, 0))
    res = lm_eval.simple_evaluate(model=lm, tasks=list(tasks), task_manager=TaskManager(include_path=str(tmp_path)))
    for t in tasks:
        assert res["results"][t]["acc,none"] == (1.0 if right else 0.0), t


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
