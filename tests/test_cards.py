"""Model cards of the tiny pipeline's checkpoints (written by stage 07): size, recipe, acceptance, serve command."""
import json
import shlex
from pathlib import Path

import pytest
import yaml

from qdflash.runio import read_json

KINDS = {"rtn": "W4A16", "gptq": "W4A16", "qad": "W4A16", "twin": None, "pretrain": None, "two_stage": None,
         "direct": None, "w4a16": "W4A16", "w8a16": "W8A16"}


@pytest.fixture(scope="module")
def cards(tiny_pipeline):
    from qdflash.cards import Run, checkpoints, write_cards
    runs = tiny_pipeline["runs"]
    written = write_cards(runs)                 # stage 07 wrote them already; rewriting must be idempotent
    run = Run(runs)
    return runs, run, {c.kind: c for c in checkpoints(run)}, written


def test_every_checkpoint_has_a_card(cards):
    runs, run, cks, written = cards
    assert set(cks) == set(KINDS)
    assert sorted(written) == sorted(c.path / "README.md" for c in cks.values())
    assert sorted(read_json(runs / "07_figures" / "metrics.json")["cards"]) == sorted(str(p) for p in written)
    for c in cks.values():
        rec = yaml.safe_load((c.path / "recipe.yaml").read_text())
        q = rec["quantization"]
        assert (q["scheme"] if q else None) == KINDS[c.kind], c.kind
        if q:
            cfg = json.loads((c.path / "config.json").read_text())["quantization_config"]
            assert q["group_size"] == next(iter(cfg["config_groups"].values()))["weights"]["group_size"]
    # llmcompressor's own recipe is kept next to the card's
    assert "GPTQModifier" in (cks["gptq"].path / "recipe.llmcompressor.yaml").read_text()
    assert yaml.safe_load((cks["gptq"].path / "recipe.yaml").read_text())["calibration"]["sequences"] == \
        read_json(runs / "01_qad" / "config.json")["calib_samples"]


def test_card_names_the_size_on_disk(cards):
    _, _, cks, _ = cards
    for c in cks.values():
        n = sum(p.stat().st_size for p in c.path.glob("*.safetensors"))
        text = (c.path / "README.md").read_text()
        assert f"({n} bytes of safetensors)" in text, c.kind
        assert yaml.safe_load((c.path / "recipe.yaml").read_text())["size_bytes"] == n
    # the INT4 drafter is smaller than the INT8 one, which is smaller than FP32
    size = {k: yaml.safe_load((cks[k].path / "recipe.yaml").read_text())["size_bytes"] for k in ("w4a16", "w8a16", "two_stage")}
    assert size["w4a16"] < size["w8a16"] < size["two_stage"]


def test_serve_command_parses_and_points_at_the_checkpoints(cards):
    runs, run, cks, _ = cards
    B = read_json(runs / "03_drafter_finetune" / "config.json")["block_size"]
    for c in cks.values():
        text = (c.path / "README.md").read_text()
        cmd = text.split("```bash\n", 1)[1].split("\n```", 1)[0]
        argv = shlex.split(cmd)
        assert argv[:2] == ["vllm", "serve"]
        target = argv[2]
        spec = json.loads(argv[argv.index("--speculative-config") + 1])
        assert spec["method"] == "dflash" and spec["num_speculative_tokens"] == B - 1
        for p in (target, spec["model"]):
            assert (Path(p) / "config.json").exists(), (c.kind, p)
        if c.is_drafter:
            assert spec["model"] == str(c.path.resolve())
            want = run.source()[1] if c.kind == "pretrain" else str(cks["qad"].path.resolve())
            assert target == want, c.kind
        else:
            assert target == str(c.path.resolve())


def test_card_acceptance_table_is_the_measured_one(cards):
    runs, _, cks, _ = cards
    grid = read_json(runs / "03_drafter_finetune" / "metrics.json")["decoding"]
    st = grid["qad"]["two_stage"]
    text = (cks["two_stage"].path / "README.md").read_text()
    row = next(ln for ln in text.splitlines() if ln.startswith("| QAD W4A16 | two_stage | reference"))
    cells = [x.strip() for x in row.strip("|").split("|")]
    assert cells[4] == f"{st['tau']:.3f} [{st['tau_ci95'][0]:.3f}, {st['tau_ci95'][1]:.3f}]"
    assert cells[5] == f"{st['per_position'][0]:.3f} [{st['per_position_ci95'][0][0]:.3f}, " \
                       f"{st['per_position_ci95'][0][1]:.3f}]"
    assert cells[-1] == str(st["steps"])
    dq = read_json(runs / "04_drafter_quant" / "metrics.json")["table"]
    w4 = (cks["w4a16"].path / "README.md").read_text()
    assert f"{dq['w4a16']['tau']:.3f}" in w4 and "| 24 |" in w4     # with and without the tiny SWA window (24)
    assert "No drafter was measured" in (cks["rtn"].path / "README.md").read_text()
