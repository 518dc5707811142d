"""QAD on tiny: the configured recipe changes INT4 codes and lowers held-out KL below the PTQ start (with the step-0
gate and the best-checkpoint selection recorded); packed == twin == fake-quant weights in fp32 and bf16, for the
frozen grid and for learned scales."""
import pytest
import torch

from qdflash import quant as Q
from qdflash.config import DataConfig, QADConfig, load_config
from qdflash.models import resolve_target


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    from qdflash.stages.s00_data import run_data
    out = tmp_path_factory.mktemp("qad") / "00_data"
    run_data(load_config(DataConfig, "tiny"), out, progress=False)
    return out


def test_qad_run_changes_codes_and_beats_its_ptq_start(tiny_data):
    from qdflash.stages.s01_qad import run_qad
    cfg = load_config(QADConfig, "tiny")
    m = run_qad(cfg, tiny_data.parent / "01_qad", tiny_data, progress=False).metrics
    tr = m["qad_training"]
    assert tr["select_curve"][0]["step"] == 0                       # the step-0 gate is measured ...
    assert tr["best_step"] > 0                                      # ... and training improved on it
    assert tr["best_select_kl"] < tr["select_curve"][0]["select_kl"]
    assert tr["codes_changed_final"] > 0
    assert max(tr["codes_changed_per_layer"].values()) > 0
    assert m["codes_curve"][-1]["codes_changed"] > 0 and m["codes_curve"][-1]["step"] == cfg.steps
    assert tr["lr_sum_over_median_half_step"] == pytest.approx(tr["lr_sum"] / tr["median_half_step"])
    e = m["eval"]
    assert e["qad"]["kl_to_teacher"] < e["gptq"]["kl_to_teacher"]   # held-out (never used for selection)
    ci = m["qad_vs_gptq_kl"]
    assert ci["ratio"] == pytest.approx(e["qad"]["kl_to_teacher"] / e["gptq"]["kl_to_teacher"], rel=1e-6)
    assert ci["ratio_ci95"][0] <= ci["ratio"] <= ci["ratio_ci95"][1]


@pytest.mark.parametrize("learn_scale", [False, True])
def test_packed_twin_and_fake_quant_weights_agree(tmp_path, learn_scale):
    """With the grid rounded to bf16 (``scale_dtype``, as the bf16 presets do), the bf16-loaded packed checkpoint
    equals the twin bit for bit; with fp32 scales it would not (compressed-tensors casts the scales to bf16)."""
    from transformers import AutoModelForCausalLM

    from qdflash.qad import save_twin
    base = resolve_target("tiny")
    ptq = Q.quantize_ptq(base, "rtn", 32, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
                    [], tmp_path / "rtn")
    student, group, bits = Q.load_fake_quant_model(ptq, base, torch.float32, "jitter", 0, learn_scale=learn_scale,
                                                   scale_dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():                                # "training": move latents (and scales) off the start
        for m in student.modules():
            if isinstance(m, Q.FakeQuantLinear):
                m.weight.add_(torch.randn(m.weight.shape, generator=g) * 0.02)
                if learn_scale:
                    m.weight_scale.mul_(1 + 0.05 * torch.rand(m.weight_scale.shape, generator=g))
    fq = {n: m for n, m in student.named_modules() if isinstance(m, Q.FakeQuantLinear)}
    moved = sum(int((m.codes() != Q.read_grid(ptq)[0][n].float()).sum()) for n, m in fq.items())
    assert moved > 0
    packed = Q.pack_checkpoint(student, ptq, tmp_path / "qad")
    twin = save_twin(student, base, tmp_path / "twin")
    ints, scales, _, _ = Q.read_grid(packed)
    for n, m in fq.items():                              # the packed codes/scales are the student's own
        assert torch.equal(ints[n].float(), m.codes())
        assert torch.equal(scales[n], m.grid_scale().detach())
        assert torch.equal(scales[n], scales[n].to(torch.bfloat16).float())
    ids = torch.randint(0, 300, (2, 24), generator=g)
    with torch.no_grad():
        ref = student(ids).logits                        # the fake-quant forward (fp32 latents, fp32 compute)
    for dt in (torch.float32, torch.bfloat16):
        a = AutoModelForCausalLM.from_pretrained(packed, dtype=dt)      # compressed-tensors, decompressed by it
        b = AutoModelForCausalLM.from_pretrained(twin, dtype=dt)        # dense
        for n, m in fq.items():
            assert torch.equal(b.get_submodule(n).weight, m.quantized_weight().detach().to(dt)), (n, dt)
        with torch.no_grad():
            la, lb = a(ids).logits, b(ids).logits
        assert torch.equal(la, lb), (dt, (la - lb).abs().max())
        if dt == torch.float32:
            assert torch.equal(la, ref), (la - ref).abs().max()
