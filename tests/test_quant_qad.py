import torch

from qdflash import quant as Q
from qdflash.config import QADConfig, load_config
from qdflash.qad import collate, compare_to_teacher, kl_loss, names
from qdflash.runio import read_json, read_jsonl


def test_pack_unpack_roundtrip():
    from compressed_tensors.compressors import pack_to_int32, unpack_from_int32
    g = torch.Generator().manual_seed(0)
    for bits in (4, 8):
        lo, hi = Q.qrange(bits)
        q = torch.randint(lo, hi + 1, (24, 64), generator=g, dtype=torch.int8)
        assert torch.equal(unpack_from_int32(pack_to_int32(q, bits), bits, q.shape).to(torch.int8), q)


def test_fake_quant_is_on_grid_with_identity_gradient():
    torch.manual_seed(0)
    w = torch.randn(8, 64, requires_grad=True)
    s = Q.absmax_scale(w, 32, 4)
    wq = Q.fake_quant(w, s, 32)
    q = wq.detach().reshape(8, 2, 32) / s.unsqueeze(-1)
    assert torch.allclose(q, q.round(), atol=1e-5) and q.min() > -8.001 and q.max() < 7.001
    wq.sum().backward()
    assert torch.equal(w.grad, torch.ones_like(w))


def test_one_qad_step_lowers_kl(tiny_pipeline):
    runs = tiny_pipeline["runs"]
    cfg = load_config(QADConfig, "tiny")
    q = runs / "01_qad"
    base = read_json(runs / "00_data" / "config.json")["target"]
    from qdflash.models import load_model, resolve_target
    teacher = load_model(base)
    student, _, _ = Q.load_fake_quant_model(q / names(cfg)["gptq"], resolve_target(base), latent_init="jitter")
    rows = read_jsonl(runs / "00_data" / "train.jsonl")[:4]
    batch = collate(rows, cfg.seq_len, 0)
    params = [m.weight for m in student.modules() if isinstance(m, Q.FakeQuantLinear)]
    for p in student.parameters():
        p.requires_grad_(p in set(params))
    with torch.no_grad():
        before = float(kl_loss(student, teacher, batch, 64)[0])
    opt = torch.optim.Adam(params, lr=1e-3)
    loss, _ = kl_loss(student, teacher, batch, 64)
    loss.backward()
    opt.step()
    with torch.no_grad():
        after = float(kl_loss(student, teacher, batch, 64)[0])
    assert before > 0 and after < 0.99 * before
    # jittered latents keep the PTQ model exactly: the starting KL equals the GPTQ checkpoint's
    grid, _, _ = Q.load_fake_quant_model(q / names(cfg)["gptq"], resolve_target(base), latent_init="grid")
    with torch.no_grad():
        assert abs(float(kl_loss(grid, teacher, batch, 64)[0]) - before) < 1e-6


def test_packed_qad_checkpoint_reproduces_fake_quant_logits(tiny_pipeline):
    """Reloading the exported pack-quantized student with transformers gives the fake-quant forward exactly."""
    from transformers import AutoModelForCausalLM
    runs = tiny_pipeline["runs"]
    cfg = load_config(QADConfig, "tiny")
    nm = names(cfg)
    from qdflash.models import resolve_target
    base = resolve_target(read_json(runs / "00_data" / "config.json")["target"])
    fq, _, _ = Q.load_fake_quant_model(runs / "01_qad" / nm["qad"], base)
    packed = AutoModelForCausalLM.from_pretrained(runs / "01_qad" / nm["qad"], dtype=torch.float32).eval()
    twin = AutoModelForCausalLM.from_pretrained(runs / "01_qad" / nm["twin"], dtype=torch.float32).eval()
    ids = torch.tensor([read_jsonl(runs / "00_data" / "val.jsonl")[0]["input_ids"]])
    with torch.no_grad():
        a, b, c = fq(ids).logits, packed(ids).logits, twin(ids).logits
    assert torch.allclose(a, b, atol=1e-5, rtol=0) and torch.allclose(a, c, atol=1e-5, rtol=0)
    # the packed ints equal a re-pack of the fake-quant weights: no re-quantization happened
    ints, scales, group, _ = Q.read_grid(runs / "01_qad" / nm["qad"])
    for name, qv in ints.items():
        m = fq.get_submodule(name)
        assert torch.equal(Q.quantize_ints(m.weight.detach(), m.weight_scale, group).to(torch.int8), qv)


def test_ptq_and_qad_artifacts_load_and_metrics_are_consistent(tiny_pipeline):
    from transformers import AutoModelForCausalLM
    runs = tiny_pipeline["runs"]
    m = read_json(runs / "01_qad" / "metrics.json")
    for key in ("rtn", "gptq", "qad"):
        d = runs / "01_qad" / m["names"][key]
        qc = read_json(d / "config.json")["quantization_config"]
        assert qc["format"] == "pack-quantized"
        assert next(iter(qc["config_groups"].values()))["weights"]["group_size"] == m["group_size"]
        AutoModelForCausalLM.from_pretrained(d)
        ev = m["eval"][key]
        assert ev["kl_to_teacher"] > 0 and 0 <= ev["top1_agreement"] <= 1
        assert ev["file_mb"] < m["eval"]["teacher"]["file_mb"]
    assert m["eval"]["teacher"]["kl_to_teacher"] == 0


def test_corrupt_checkpoint_is_a_clear_error(tmp_path, tiny_pipeline):
    import shutil
    import pytest
    src = tiny_pipeline["runs"] / "01_qad" / names(load_config(QADConfig, "tiny"))["gptq"]
    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    (bad / "model.safetensors").write_bytes((bad / "model.safetensors").read_bytes()[:1000])
    with pytest.raises(ValueError, match="corrupt"):
        Q.read_grid(bad)
