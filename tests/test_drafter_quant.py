import json

import torch

from qdflash.drafter import load_drafter
from qdflash.runio import read_json


def test_packed_w4_drafter_reloads_identical_to_fake_quant(tiny_pipeline, tmp_path):
    """GPTQ on the tiny drafter: the packed checkpoint reloads to exactly the in-memory on-grid weights."""
    from qdflash.drafter_quant import collect_hessians, gptq_drafter, save_packed_drafter
    from qdflash.models import load_model
    from qdflash.runio import read_jsonl
    runs = tiny_pipeline["runs"]
    fm = read_json(runs / "03_drafter_finetune" / "metrics.json")
    qm = read_json(runs / "01_qad" / "metrics.json")
    d = load_drafter(runs / "03_drafter_finetune" / fm["drafters"]["two_stage"])
    twin = load_model(str(runs / "01_qad" / qm["names"]["twin"]))
    rows = read_jsonl(runs / "00_data" / "train.jsonl")[:3]
    H = collect_hessians(d, twin, rows, 3, include_fc=True)
    assert set(H) >= {"fc", "layers.0.self_attn.q_proj", "layers.0.mlp.down_proj"}
    res = gptq_drafter(d, H, 32, 0.01)
    p = save_packed_drafter(d, {k: v[0] for k, v in res.items()}, 4, 32, tmp_path / "drafter-w4a16-g32")
    r = load_drafter(p)
    for k, v in d.state_dict().items():
        assert torch.allclose(v, r.state_dict()[k], atol=1e-6, rtol=0), k
    qc = json.loads((p / "config.json").read_text())["quantization_config"]
    assert qc["format"] == "pack-quantized" and qc["config_groups"]["group_0"]["weights"]["num_bits"] == 4
    # same outputs through the decoder-facing forward
    ctx = torch.randn(1, 7, d.fc.in_features)
    noise = torch.randn(1, d.block_size, d.config.hidden_size)
    q, c = torch.arange(7, 7 + d.block_size)[None], torch.arange(7)[None]
    assert torch.allclose(d(noise, ctx, q, c), r(noise, ctx, q, c), atol=1e-5)


def test_drafter_quant_stage_outputs(tiny_pipeline):
    runs = tiny_pipeline["runs"]
    m = read_json(runs / "04_drafter_quant" / "metrics.json")
    t = m["table"]
    W = m["swa_window"]
    for name in ("fp32", "w8a16", "w4a16"):
        for key in (name, f"{name}-swa{W}"):
            assert t[key]["mismatched_outputs"] == 0          # greedy speculation is lossless, any precision
            assert abs(sum(t[key]["per_position"]) - (t[key]["tau"] - 1)) < 1e-9
    assert m["disk_bytes"]["w4a16"] < m["disk_bytes"]["w8a16"] < m["disk_bytes"]["fp32"]
    w8 = read_json(runs / "04_drafter_quant" / m["checkpoints"]["w8a16"] / "config.json")["quantization_config"]
    assert next(iter(w8["config_groups"].values()))["weights"]["num_bits"] == 8
