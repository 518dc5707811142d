import json, sys, time
from pathlib import Path
from qdflash.drafter import load_drafter
from qdflash.drafter_train import eval_prompts
from qdflash.models import load_model, load_tokenizer, resolve_target
from qdflash.runio import read_json
from qdflash.decode_stats import results_to_json
from qdflash.speculative import compare_with_plain
import torch
R = Path("/tmp/runs-smol-gpu"); which = sys.argv[1]; out = Path(sys.argv[2])
qm = read_json(R / "01_qad/metrics.json"); ft = R / "03_drafter_finetune"
tspec = resolve_target("smol") if which == "fp" else str(R / "01_qad" / qm["names"]["qad"])
names = {"fp": ["two_stage", "pretrain"], "qad": ["two_stage", "direct"]}[which]
paths = {"two_stage": ft / "drafter-twostage-L2-b8", "direct": ft / "drafter-direct-L2-b8",
         "pretrain": R / "02_drafter_pretrain/drafter-pretrain-L2-b8"}
tok = load_tokenizer("smol"); tgt = load_model(tspec, "float32")
prompts = eval_prompts(R / "00_data", 32)
drafters = {n: load_drafter(paths[n], torch.float32).to(tgt.device) for n in names}
t0 = time.time(); per = {}
g = compare_with_plain(tgt, prompts, 128, drafters, 0.0, tok.eos_token_id, seed=0, progress=False, results=per)
json.dump({"target": tspec, "prompts": len(prompts), "max_new_tokens": 128, "dtype": "float32", "grid": g,
           "wall_s": time.time() - t0, "results": {k: results_to_json(v) for k, v in per.items()}},
          open(out / f"eval-{which}.json", "w"), indent=1, default=str)
print(which, {k: round(v.get("tau", 1), 3) for k, v in g.items()}, round(time.time() - t0, 1))
