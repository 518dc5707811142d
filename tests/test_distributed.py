"""Data-parallel training (``qdflash.distributed``: FSDP2 under torchrun) on the CPU with gloo, 2 processes, tiny.

The 2-process runs go through the same ``train_qad`` / ``train_drafter`` as one process: the workers are forked
with torchrun's environment variables (``RANK``, ``WORLD_SIZE``, ...), which is all the code looks at. Forking
keeps them cheap (the CLI path through the real ``torchrun`` is tested once, at the end).

Compared with the one-process run of the same global batch (4 rows; 2 ranks x 2 micro-batches of 1 row each, so
gradient accumulation is covered): the per-step loss and clipped gradient norm, and the trained weights at the
end. The tolerances: ``RTOL`` = 1e-5 relative on every step's loss and gradient norm, and ``RTOL_W`` = 1e-3 on the
trained weights, as the distance between the two runs' weights over the distance training moved them. Everything is
fp32, and the two runs compute the same sums in another order: partial sums per rank, then all-reduced;
micro-batches of 1 row instead of one matmul over 4 rows (other BLAS blocking); padding trimmed per micro-batch.
Measured here: at most 2.5e-7 on the losses, 8e-7 on the norms, and 1.2e-5 on the weights. The weights get the
looser bound because AdamW's first steps are sign-like (m / sqrt(v)), so a gradient entry at rounding level can
move by a whole lr in either run. An error in the data-parallel arithmetic is a factor, not a rounding: a missing
world-size factor halves the norm, and a rank that skips its rows, or its share of the reduction, moves the loss
and the weights by percents. A killed and resumed run must equal the uninterrupted 2-process run exactly (tolerance
0): it replays the same operations from the state the checkpoint holds.
"""
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch

from qdflash import distributed
from qdflash.config import DrafterConfig, QADConfig, load_config
from qdflash.drafter import DFlashDraftModel, new_drafter
from qdflash.drafter_train import precompute_features, train_drafter
from qdflash.models import load_model, load_tokenizer, mask_token_id, resolve_target
from qdflash.qad import train_qad
from qdflash.quant import FakeQuantLinear, absmax_scale, apply_fake_quant

REPO = Path(__file__).resolve().parents[1]
RTOL, RTOL_W = 1e-5, 1e-3
K_QAD, DRAFTER_EPOCHS = 6, 2                 # 12 rows / batch 4: 3 steps an epoch, both cross an epoch boundary


def _rows(n: int, seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        L = int(torch.randint(20, 60, (1,), generator=g))
        p = L // 3
        rows.append({"input_ids": torch.randint(4, 300, (L,), generator=g).tolist(),
                     "loss_mask": [0] * p + [1] * (L - p), "prompt_len": p})
    return rows


# ----------------------------------------------------------------------------------------------- the jobs
def _student():
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(resolve_target("tiny"), dtype=torch.float32)
    targets = QADConfig.__dataclass_fields__["quant_targets"].default
    scales = {n: absmax_scale(x.weight, 32, 4) for n, x in m.named_modules()
              if isinstance(x, torch.nn.Linear) and n.split(".")[-1] in targets}
    apply_fake_quant(m, scales, 32, 4)            # latents = the dense weights, off the grid: codes flip early
    return m


def _latents(model) -> dict[str, torch.Tensor]:
    return {n: m.weight.detach().cpu().clone() for n, m in model.named_modules() if isinstance(m, FakeQuantLinear)}


def _qad(out: Path, micro: int) -> None:
    cfg = load_config(QADConfig, "tiny", steps=K_QAD, batch_size=4, micro_batch_size=micro, save_every=2,
                      eval_every=2)
    teacher, student = load_model("tiny", "float32", "cpu"), _student()
    init = _latents(student)
    rows = _rows(14, seed=1)
    (out / "ckpt").mkdir(parents=True, exist_ok=True)
    log, summary = train_qad(cfg, student, teacher, rows[:12], 0, out / "ckpt", out / "qad.jsonl", False, rows[12:])
    dp = distributed.current()
    plain = student if dp is None else dp.unsharded(student, _student)
    if plain is not None:
        torch.save({"log": log, "summary": summary, "weights": _latents(plain), "init": init}, out / "qad.pt")


def _drafter(out: Path, micro: int) -> None:
    cfg = load_config(DrafterConfig, "tiny", batch_size=4, micro_batch_size=micro, save_every=2)
    target, tok = load_model("tiny", "float32", "cpu"), load_tokenizer("tiny")
    rows = _rows(12, seed=2)
    feats = precompute_features(target, rows, cfg.target_layer_ids, cfg.max_len)
    d = new_drafter(target, cfg.num_layers, cfg.block_size, cfg.target_layer_ids, mask_token_id(tok), seed=1)
    init = {n: p.detach().clone() for n, p in d.named_parameters()}
    out.mkdir(parents=True, exist_ok=True)
    log = train_drafter(d, target, rows, feats, cfg, DRAFTER_EPOCHS, out / "d.ckpt.pt", out / "d.jsonl", "d",
                        progress=False)
    dp, config = distributed.current(), d.config
    plain = d if dp is None else dp.unsharded(d, lambda: DFlashDraftModel(config))
    if plain is not None:
        torch.save({"log": log, "weights": {n: p.detach().cpu().clone() for n, p in plain.named_parameters()},
                    "init": init}, out / "drafter.pt")


def _both(out: Path, micro: int, die: tuple[str, int, str] | None = None) -> None:
    if die is not None:
        _install_death(*die)
    if not (out / "qad.pt").exists():
        _qad(out, micro)
    _drafter(out, micro)


def _install_death(job: str, step: int, where: str) -> None:
    """Kill this process (a crash, no cleanup) in job ``job``: in the step after the checkpoint of ``step``
    (``where="next"``, after the first micro-batch's backward), or inside the checkpoint of ``step`` once the
    shards are written but before rank 0 marks it complete (``where="save"``)."""
    from qdflash.distributed import DataParallel
    save, acc, real_torch_save = DataParallel.save, DataParallel.accumulate, torch.save
    armed = {"saved": False}
    is_job = (lambda m: "evals" in m) if job == "qad" else (lambda m: "gen_state" in m)

    def dying_save(self, path, model, opt, meta, *args, **kw):
        if where == "save" and is_job(meta) and meta["step"] == step:
            torch.save = lambda obj, f, *a, **k: os._exit(19) if str(f).endswith("meta.pt") else real_torch_save(
                obj, f, *a, **k)
        save(self, path, model, opt, meta, *args, **kw)
        armed["saved"] = where == "next" and is_job(meta) and meta["step"] == step

    def dying_accumulate(self, parts, loss_of):
        if armed["saved"]:
            loss_of(parts[0]).backward()
            os._exit(17)
        return acc(self, parts, loss_of)
    DataParallel.save, DataParallel.accumulate = dying_save, dying_accumulate


# ----------------------------------------------------------------------------------------------- launching
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, fn, args) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), QDFLASH_DEVICE="cpu",
                      QDFLASH_DIST_TIMEOUT_MIN="2")
    torch.set_num_threads(1)
    code = 0
    try:
        fn(*args)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)                               # a forked child: never run pytest's exit handlers


def launch(fn, *args, world: int = 2, timeout: float = 240) -> list[int]:
    """Run ``fn(*args)`` in ``world`` forked processes with torchrun's environment; their exit codes."""
    ctx = mp.get_context("fork")
    port = _free_port()
    procs = [ctx.Process(target=_entry, args=(r, world, port, fn, args)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    for p in procs:
        if p.is_alive():                         # a hung collective: end only the processes started here
            p.kill()
            p.join()
    return [p.exitcode for p in procs]


# ----------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    assert not distributed.launched(), "run pytest itself without torchrun"
    root = tmp_path_factory.mktemp("dp")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _both(root / "one", 0)                   # one process, the plain path (no torch.distributed)
    finally:
        torch.set_num_threads(n)
    assert launch(_both, root / "two", 1) == [0, 0]
    load = lambda d, f: torch.load(root / d / f, weights_only=False)   # noqa: E731
    return {"root": root, "one": {k: load("one", f"{k}.pt") for k in ("qad", "drafter")},
            "two": {k: load("two", f"{k}.pt") for k in ("qad", "drafter")}}


def _norm(d: dict) -> float:
    return sum(float((v.double() ** 2).sum()) for v in d.values()) ** 0.5


def _assert_close_runs(a: dict, b: dict, key: str, rtol: float, rtol_w: float) -> None:
    """Per-step ``key`` and grad norm within ``rtol``; the trained weights' distance within ``rtol_w`` of how far
    training moved them (``a``'s update)."""
    assert len(a["log"]) == len(b["log"]) > 0
    for ra, rb in zip(a["log"], b["log"]):
        for k in (key, "grad_norm"):
            assert rb[k] == pytest.approx(ra[k], rel=rtol, abs=1e-12), (ra["step"], k, ra[k], rb[k])
    assert a["weights"].keys() == b["weights"].keys() == a["init"].keys()
    moved = _norm({n: w - a["init"][n] for n, w in a["weights"].items()})
    dist = _norm({n: w - b["weights"][n] for n, w in a["weights"].items()})
    assert moved > 0 and dist <= rtol_w * moved, (dist, moved)


# ----------------------------------------------------------------------------------------------- tests
def test_qad_two_processes_match_one(runs):
    one, two = runs["one"]["qad"], runs["two"]["qad"]
    _assert_close_runs(one, two, "kl", RTOL, RTOL_W)
    assert [r["tokens"] for r in one["log"]] == [r["tokens"] for r in two["log"]]   # the same global batches
    for k in ("best_step", "codes_changed_final"):
        assert two["summary"][k] == pytest.approx(one["summary"][k], rel=RTOL), k
    assert one["summary"]["codes_changed_final"] > 0
    for ea, eb in zip(one["summary"]["select_curve"], two["summary"]["select_curve"]):
        assert eb["select_kl"] == pytest.approx(ea["select_kl"], rel=RTOL)


def test_drafter_two_processes_match_one(runs):
    one, two = runs["one"]["drafter"], runs["two"]["drafter"]
    _assert_close_runs(one, two, "loss", RTOL, RTOL_W)
    assert [r["n_sup"] for r in one["log"]] == [r["n_sup"] for r in two["log"]]     # the same anchors
    assert [r["acc"] for r in one["log"]] == pytest.approx([r["acc"] for r in two["log"]], abs=1e-6)
    assert one["log"][-1]["loss"] < one["log"][0]["loss"]


def test_killed_runs_resume_to_the_uninterrupted_result_also_on_another_world_size(runs):
    d, re1 = runs["root"] / "killed", runs["root"] / "reshard"
    # QAD dies in step 3 (after the checkpoint of step 2), then inside the checkpoint of step 4
    assert 0 not in launch(_both, d, 1, ("qad", 2, "next"))
    meta = torch.load(d / "ckpt" / "last.dcp" / "meta.pt", weights_only=False)
    assert meta["step"] == 2 and not (d / "qad.pt").exists()
    shutil.copytree(d / "ckpt", re1 / "ckpt")
    assert 0 not in launch(_both, d, 1, ("qad", 4, "save"))
    assert torch.load(d / "ckpt" / "last.dcp" / "meta.pt", weights_only=False)["step"] == 2
    assert (d / "ckpt" / "last.dcp.tmp").exists() and not (d / "ckpt" / "last.dcp.tmp" / "meta.pt").exists()
    # QAD resumes from step 2 and finishes; the drafter dies in step 5 (after its mid-epoch checkpoint of step 4)
    assert 0 not in launch(_both, d, 1, ("drafter", 4, "next"))
    assert (d / "qad.pt").exists()
    assert torch.load(d / "d.ckpt.dcp" / "meta.pt", weights_only=False)["step"] == 4
    assert launch(_both, d, 1) == [0, 0]
    for job, key in (("qad", "kl"), ("drafter", "loss")):
        got = torch.load(d / f"{job}.pt", weights_only=False)
        _assert_close_runs(runs["two"][job], got, key, 0.0, 0.0)
    # DCP reshards: the 2-process checkpoint of step 2 continues on 1 process (2 micro-batches of 2 rows) to the
    # 2-process result, within the 1-vs-2-process tolerance
    assert launch(_qad, re1, 2, world=1) == [0]
    _assert_close_runs(runs["two"]["qad"], torch.load(re1 / "qad.pt", weights_only=False), "kl", RTOL, RTOL_W)


@pytest.mark.slow
def test_torchrun_cli_matches_one_process(tmp_path):
    """The real launcher: ``torchrun --standalone --nproc_per_node 2 -m qdflash.cli run 02_drafter_pretrain``."""
    from qdflash.pipeline import run_stage
    one, two = tmp_path / "one", tmp_path / "two"
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_stage("00_data", "tiny", one, progress=False)
        shutil.copytree(one / "00_data", two / "00_data")
        ref = run_stage("02_drafter_pretrain", "tiny", one, progress=False)
    finally:
        torch.set_num_threads(n)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "QDFLASH_DEVICE": "cpu",
           "PYTHONPATH": str(REPO / "src")}
    r = subprocess.run([str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node", "2",
                        "-m", "qdflash.cli", "run", "02_drafter_pretrain", "--preset", "tiny", "--runs", str(two),
                        "--no-progress", "--set", "micro_batch_size=1"],
                       env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    from qdflash.runio import read_json, read_jsonl
    got = read_json(two / "02_drafter_pretrain" / "metrics.json")
    name = ref.metrics["drafter"]
    assert got["drafter"] == name and (two / "02_drafter_pretrain" / name / "config.json").exists()
    assert (two / "02_drafter_pretrain" / f"{name}.ckpt.dcp" / "meta.pt").exists()
    a = read_jsonl(one / "02_drafter_pretrain" / f"train_log-{name}.jsonl")
    b = read_jsonl(two / "02_drafter_pretrain" / f"train_log-{name}.jsonl")
    assert len(a) == len(b) == ref.metrics["train"]["steps"]
    assert [x["loss"] for x in b] == pytest.approx([x["loss"] for x in a], rel=RTOL)
    assert [x["grad_norm"] for x in b] == pytest.approx([x["grad_norm"] for x in a], rel=RTOL)


def test_memory_plan_counts_the_real_shapes():
    """``memory_plan`` counts the parameters of the models that train (tiny), and shards what FSDP shards."""
    from qdflash.memory_plan import GiB, drafter_plan, qad_plan
    cfg = load_config(QADConfig, "tiny")
    one, two = qad_plan(cfg, 1), qad_plan(cfg, 2)
    student = _student()
    assert one["params"] == sum(p.numel() for p in student.parameters())
    assert one["quantized_params"] == sum(w.numel() for w in _latents(student).values())
    adam = "AdamW moments, fp32 (1/N)"
    assert one["gib"][adam] * GiB == 8 * one["quantized_params"] and two["gib"][adam] == one["gib"][adam] / 2
    assert two["gib"]["teacher (replicated)"] == one["gib"]["teacher (replicated)"] > 0
    dcfg = load_config(DrafterConfig, "tiny")
    d = new_drafter(load_model("tiny", "float32", "cpu"), dcfg.num_layers, dcfg.block_size, dcfg.target_layer_ids,
                    mask_token_id(load_tokenizer("tiny")))
    plan = drafter_plan(dcfg, 2, "tiny")
    assert plan["drafter_params"] == sum(p.numel() for p in d.parameters())
    assert plan["target_params"] == one["params"]
