"""Stage 03's finetune set (the training prompts answered by the QAD target) and per-batch target features."""
import json

import pytest
import torch

from qdflash.data import load_split, regenerate_rows
from qdflash.models import resolve_target


def test_finetune_set_is_regenerated_by_the_qad_target(tiny_pipeline):
    runs = tiny_pipeline["runs"]
    m = json.loads((runs / "03_drafter_finetune" / "metrics.json").read_text())
    fd = m["finetune_data"]
    assert fd["source"] == "qad" and fd["target"].endswith("-twin")
    rows = load_split(runs / "03_drafter_finetune" / "finetune_data", "train")
    fp_rows = load_split(runs / "00_data", "train")
    # the same prompts, in the same order, with the QAD target's answers
    assert [r["id"] for r in rows] == [r["id"] for r in fp_rows][: len(rows)]
    assert all(r["input_ids"][: r["prompt_len"]] == f["input_ids"][: f["prompt_len"]] for r, f in zip(rows, fp_rows))
    assert fd["same_as_stage00"] < len(rows)     # the random tiny target's INT4 student answers differently


def test_regenerating_with_the_fp_target_reproduces_stage_00(tiny_pipeline, tmp_path):
    """Greedy, fp32, same batches: the stage-00 target must give back stage 00's responses token for token (this fails
    if the prompt were cut at the wrong place or the generation settings were not stage 00's)."""
    runs = tiny_pipeline["runs"]
    fp_rows = load_split(runs / "00_data", "train")
    rows, info = regenerate_rows(resolve_target("tiny"), fp_rows, runs / "00_data", tmp_path, progress=False)
    assert info["same_as_stage00"] == len(fp_rows) and info["backend"] == "hf"
    assert [r["input_ids"] for r in rows] == [r["input_ids"] for r in fp_rows]
    # resumable: a finished answer in the partial file is taken as it is (a marked one comes back marked) ...
    part = tmp_path / "generations.partial.jsonl"
    recs = [json.loads(x) for x in part.read_text().splitlines()]
    recs[0]["gen_ids"] = recs[0]["gen_ids"][:1] + [7, 7, 7]
    part.write_text("".join(json.dumps(r) + "\n" for r in recs))
    rows2, _ = regenerate_rows(resolve_target("tiny"), fp_rows, runs / "00_data", tmp_path, progress=False)
    marked = {r["id"]: r for r in rows2}[recs[0]["id"]]
    assert marked["input_ids"][marked["prompt_len"]:] == recs[0]["gen_ids"]
    # ... unless another model wrote it: then everything is generated again
    gen = json.loads((tmp_path / "generator.json").read_text())
    (tmp_path / "generator.json").write_text(json.dumps({**gen, "weights_sha256": "another model"}))
    rows3, _ = regenerate_rows(resolve_target("tiny"), fp_rows, runs / "00_data", tmp_path, progress=False)
    assert [r["input_ids"] for r in rows3] == [r["input_ids"] for r in fp_rows]


def test_online_features_equal_the_batch_computed_ones(tiny_pipeline, one_thread):
    from qdflash.features import OnlineFeatures, compute_features
    from qdflash.models import load_model
    rows = load_split(tiny_pipeline["runs"] / "00_data", "train")[:6]
    tgt = load_model("tiny", "float32")
    ref = compute_features(tgt, rows, (0, 2), 40, bs=1)          # one row at a time: no padding at all
    of = OnlineFeatures(tgt, rows, (0, 2), 40)
    of.prefetch([4, 1, 3])                                         # a batch of unequal lengths, right-padded
    for i in (4, 1, 3):
        assert of[i].shape == ref[i].shape
        torch.testing.assert_close(of[i].cpu(), ref[i], rtol=1e-4, atol=1e-5)
    assert of.computed_rows == 3
    with pytest.raises(KeyError):                               # a row outside the prefetched batch
        of[0]


@pytest.mark.slow
def test_static_compiled_online_features_equal_the_eager_ones():
    """OnlineFeatures(static=True): batches padded to one shape and the target forward compiled give each row the
    eager per-batch features (the target is causal: the padding after a row changes none of its features)."""
    import torch

    from qdflash.features import OnlineFeatures
    from qdflash.models import load_model
    tgt = load_model("tiny", "float32")
    g = torch.Generator().manual_seed(0)
    rows = [{"input_ids": torch.randint(4, 300, (n,), generator=g).tolist()} for n in (12, 30, 7, 25, 40)]
    eager, static = OnlineFeatures(tgt, rows, (0, 2), 32), OnlineFeatures(tgt, rows, (0, 2), 32, static=True)
    for idx in ([0, 1, 2], [3, 4], [1, 4, 0]):          # a smaller batch after a larger one reuses the shape
        eager.prefetch(idx)
        static.prefetch(idx)
        for i in idx:
            assert static[i].shape == eager[i].shape == (min(32, len(rows[i]["input_ids"])), eager[i].shape[1])
            torch.testing.assert_close(static[i], eager[i], rtol=1e-4, atol=1e-4)
    assert static.computed_rows == eager.computed_rows == 8
    # make_batch takes the static batch as one padded tensor (no copy per row): the same batch, zeros after each row
    from qdflash.config import DrafterConfig, load_config
    from qdflash.drafter_train import make_batch
    cfg = load_config(DrafterConfig, "tiny", max_len=32, num_anchors=4)
    for r in rows:
        r["loss_mask"] = [0] * 3 + [1] * (len(r["input_ids"]) - 3)
    assert static.padded_batch([4, 1], 40) is None                # not the prefetched batch: make_batch copies rows
    a, b = (make_batch(rows, f, [1, 4, 0], cfg, 5, torch.Generator().manual_seed(1), 2.0) for f in (eager, static))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-4, msg=k)
    assert static.padded_batch([1, 4, 0], 32)[2, 12:].abs().sum() == 0 and a["ctx"][2, 12:].abs().sum() == 0


def test_stage_03_without_the_direct_ablation_trains_and_grids_no_direct_drafter(tiny_pipeline, tmp_path, one_thread):
    """``direct_ablation=False`` (the smol-gpu-xl preset, to fit its GPU budget): stage 03 trains the two-stage
    drafter only, its grid has no direct row on either target, and the saved result reads back without one."""
    from qdflash.config import DrafterConfig, load_config
    from qdflash.stages.s03_drafter_finetune import run_drafter_finetune, saved_result
    runs = tiny_pipeline["runs"]
    cfg = load_config(DrafterConfig, "tiny", direct_ablation=False)
    res = run_drafter_finetune(cfg, tmp_path / "03", runs / "00_data", runs / "02_drafter_pretrain", runs / "01_qad",
                               progress=False)
    m = json.loads((tmp_path / "03" / "metrics.json").read_text())
    assert set(m["drafters"]) == {"pretrain", "two_stage"} and set(m["train"]) == {"two_stage"}
    assert not list((tmp_path / "03").glob("*direct*"))
    for t in ("fp", "qad"):
        assert "direct" not in m["decoding"][t] and {"plain", "pretrain", "two_stage"} <= set(m["decoding"][t])
    assert set(saved_result(tmp_path / "03", m).drafters) == set(res.drafters) == {"pretrain", "two_stage"}
    full = json.loads((runs / "03_drafter_finetune" / "metrics.json").read_text())
    assert "direct" in full["drafters"] and "direct" in full["decoding"]["qad"]   # the default keeps the ablation


def test_stage_03_grids_only_the_targets_asked_for(tiny_pipeline, tmp_path, one_thread):
    """``grid_targets=("qad",)`` (gpu_seeds.sh: the drafters are compared on the QAD target only): no FP grid is
    decoded or saved; a grid without the QAD target, which stage 04 reads, is refused."""
    from qdflash.config import ConfigError, DrafterConfig, load_config
    from qdflash.stages.s03_drafter_finetune import run_drafter_finetune
    runs = tiny_pipeline["runs"]
    cfg = load_config(DrafterConfig, "tiny", grid_targets=["qad"])
    run_drafter_finetune(cfg, tmp_path / "03", runs / "00_data", runs / "02_drafter_pretrain", runs / "01_qad",
                         progress=False)
    m = json.loads((tmp_path / "03" / "metrics.json").read_text())
    assert set(m["decoding"]) == set(m["tau_by_source"]) == {"qad"} and not (tmp_path / "03" / "decode-fp.json").exists()
    assert {"plain", "pretrain", "two_stage", "direct"} <= set(m["decoding"]["qad"])
    for bad in (["fp"], ["qad", "int8"]):
        with pytest.raises(ConfigError):
            load_config(DrafterConfig, "tiny", grid_targets=bad)
