import pytest
import torch

from qdflash import quant as Q
from qdflash.config import QADConfig, load_config
from qdflash.qad import collate, kl_loss, names
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


def test_activation_checkpointing_recomputes_layers_with_equal_gradients(tiny_pipeline, tmp_path):
    """``activation_checkpointing`` (the full preset's): train_qad's student runs each decoder layer again in backward
    (twice the layer calls of a plain step) and gets the same step: equal KL and latents within fp32 tolerance."""
    from qdflash.models import load_model, resolve_target
    from qdflash.qad import train_qad
    runs = tiny_pipeline["runs"]
    base = read_json(runs / "00_data" / "config.json")["target"]
    teacher = load_model(base)
    rows = read_jsonl(runs / "00_data" / "train.jsonl")[:4]
    out = {}
    for ckpt in (False, True):
        cfg = load_config(QADConfig, "tiny", steps=1, batch_size=4, select_seqs=0, eval_every=10 ** 6,
                          save_every=10 ** 6, activation_checkpointing=ckpt)
        student, _, _ = Q.load_fake_quant_model(runs / "01_qad" / names(cfg)["gptq"], resolve_target(base),
                                                latent_init="jitter")
        calls = []
        student.model.layers[0].register_forward_pre_hook(lambda *a: calls.append(1))   # recompute enters it again
        (tmp_path / f"c{ckpt}").mkdir()
        log, _ = train_qad(cfg, student, teacher, rows, 0, tmp_path / f"c{ckpt}", tmp_path / f"l{ckpt}.jsonl",
                           False, None)
        w = torch.cat([m.weight.detach().flatten() for m in student.modules() if isinstance(m, Q.FakeQuantLinear)])
        out[ckpt] = (len(calls), log[0]["kl"], w)
    assert out[True][0] == 2 * out[False][0] > 0
    assert out[True][1] == pytest.approx(out[False][1], rel=1e-5)
    torch.testing.assert_close(out[True][2], out[False][2], atol=1e-6, rtol=1e-5)


@pytest.fixture(scope="module")
def rtn_template(tmp_path_factory):
    """A W4A16 g32 RTN checkpoint of the tiny target written by llmcompressor (the packer's template)."""
    from qdflash.models import resolve_target
    base = resolve_target("tiny")
    out = tmp_path_factory.mktemp("ptq") / "ptq-rtn-w4a16-g32"
    Q.quantize_ptq(base, "rtn", 32, load_config(QADConfig, "tiny").quant_targets, [], out)
    return base, out


@pytest.mark.parametrize("learn_scale", [False, True])
def test_pack_checkpoint_equals_independent_quantization(rtn_template, tmp_path, learn_scale):
    """Move the student's latents (many across bins, some past the INT4 range; with ``learn_scale`` the scales too),
    pack, reload with transformers (compressed-tensors unpacks): the logits equal those of a dense model whose weights
    are computed here with plain torch, s * clamp(round(w / s), -8, 7), from the template's scales read with
    safetensors (or the trained scales)."""

    from compressed_tensors.compressors import unpack_from_int32
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    base, tmpl = rtn_template
    kw = {}
    if learn_scale:
        kw["learn_scale"] = True
    student, group, bits = Q.load_fake_quant_model(tmpl, base, latent_init="jitter", **kw)
    assert (group, bits) == (32, 4)
    fq = {n: m for n, m in student.named_modules() if isinstance(m, Q.FakeQuantLinear)}
    tstate = load_file(str(tmpl / "model.safetensors"))
    g = torch.Generator().manual_seed(0)
    dense = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    moved = clamped = total = 0
    with torch.no_grad():
        for name, m in fq.items():
            s0 = tstate[name + ".weight_scale"].float()
            m.weight.add_(torch.randn(m.weight.shape, generator=g) * 1.5 * s0.repeat_interleave(group, 1))
            if learn_scale:
                m.weight_scale.mul_(1 + 0.2 * torch.rand(m.weight_scale.shape, generator=g))
            s = (m.weight_scale if learn_scale else s0).detach().float().repeat_interleave(group, 1)
            x = torch.round(m.weight.detach().float() / s)
            dense.get_submodule(name).weight.copy_(torch.clamp(x, -8, 7) * s)
            q_tmpl = unpack_from_int32(tstate[name + ".weight_packed"], 4, tuple(x.shape))
            moved += int((torch.clamp(x, -8, 7) != q_tmpl).sum())
            clamped += int(((x < -8) | (x > 7)).sum())
            total += x.numel()
    assert clamped > 0 and moved > 0.2 * total
    out = Q.pack_checkpoint(student, tmpl, tmp_path / "packed")
    packed = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    template = AutoModelForCausalLM.from_pretrained(tmpl, dtype=torch.float32).eval()
    ids = torch.randint(10, 380, (2, 40), generator=g)
    with torch.no_grad():
        a, b, c, t = packed(ids).logits, dense(ids).logits, student(ids).logits, template(ids).logits
    assert torch.allclose(a, b, atol=1e-5, rtol=0)         # the file holds exactly the independent computation
    assert torch.allclose(a, c, atol=1e-5, rtol=0)         # ... which is also the student's fake-quant forward
    assert not torch.allclose(a, t, atol=1e-3)             # and not just the template's integers
    if not learn_scale:
        with pytest.raises(ValueError, match="grid moved"):
            next(iter(fq.values())).weight_scale.mul_(2)
            Q.pack_checkpoint(student, tmpl, tmp_path / "bad")


def test_load_model_dequantizes_compressed_checkpoints(rtn_template):
    """``models.load_model`` turns a W4A16 checkpoint into plain ``nn.Linear`` layers whose weights are the codes x
    scales read from the file with safetensors (not the base model's), with the compressed model's fp32 logits;
    ``dense=False`` keeps transformers' compressed modules."""
    from compressed_tensors.compressors import unpack_from_int32
    from safetensors.torch import load_file

    from qdflash.models import load_model
    base, tmpl = rtn_template
    dense, packed = load_model(str(tmpl), "float32", "cpu"), load_model(str(tmpl), "float32", "cpu", dense=False)
    name = "model.layers.1.mlp.down_proj"
    lin = dense.get_submodule(name)
    assert type(lin) is torch.nn.Linear and [n for n, _ in lin.named_parameters()] == ["weight"]
    assert hasattr(packed.get_submodule(name), "weight_packed")
    st = load_file(str(tmpl / "model.safetensors"))
    q = unpack_from_int32(st[name + ".weight_packed"], 4, tuple(lin.weight.shape)).float()
    torch.testing.assert_close(lin.weight, q * st[name + ".weight_scale"].float().repeat_interleave(32, 1),
                               atol=0, rtol=0)
    ids = torch.randint(10, 380, (2, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(dense(ids).logits, packed(ids).logits)
    tied = [m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr() for m in (dense, packed)]
    assert tied[0] == tied[1] == dense.config.tie_word_embeddings          # tying kept as the checkpoint says


def test_packed_qad_checkpoint_equals_its_dense_twin(tiny_pipeline):
    """Stage 01 writes the QAD student twice through independent paths: packed integer codes (compressed-tensors,
    reloaded by transformers) and the dense de-quantized weights of the in-memory student (the twin)."""
    from transformers import AutoModelForCausalLM
    runs = tiny_pipeline["runs"]
    nm = names(load_config(QADConfig, "tiny"))
    packed = AutoModelForCausalLM.from_pretrained(runs / "01_qad" / nm["qad"], dtype=torch.float32).eval()
    twin = AutoModelForCausalLM.from_pretrained(runs / "01_qad" / nm["twin"], dtype=torch.float32).eval()
    ids = torch.tensor([read_jsonl(runs / "00_data" / "val.jsonl")[0]["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(packed(ids).logits, twin(ids).logits, atol=1e-5, rtol=0)


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
