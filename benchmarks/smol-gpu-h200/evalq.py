import json, sys, time
from pathlib import Path
from qdflash.drafter import load_drafter
from qdflash.drafter_train import eval_prompts
from qdflash.models import load_model, load_tokenizer
from qdflash.runio import read_json
from qdflash.decode_stats import acceptance_stats, results_to_json
from qdflash.speculative import generate
import torch
R = Path("/tmp/runs-smol-gpu"); out = Path(sys.argv[1])
qm = read_json(R / "01_qad/metrics.json"); tspec = str(R / "01_qad" / qm["names"]["twin"])
tok = load_tokenizer("smol"); tgt = load_model(tspec, "float32")
prompts = eval_prompts(R / "00_data", 32)
d = load_drafter(R / "03_drafter_finetune/drafter-twostage-L2-b8", torch.float32).to(tgt.device)
t0 = time.time(); res = []
for i, p in enumerate(prompts):
    res.append(generate(tgt, p, 128, drafter=d, temperature=0.0, eos_token_id=tok.eos_token_id, seed=0))
    if time.time() - t0 > 95: break
st = acceptance_stats(res)
json.dump({"target": tspec, "drafter": "two_stage", "prompts": len(res), "stats": st, "wall_s": time.time() - t0,
           "results": results_to_json(res)}, open(out / "eval-qad-twostage.json", "w"), indent=1, default=str)
print(len(res), st.get("tau"), st.get("tau_ci95"))
