"""Drafter training sweep: block-level greedy acceptance estimate on val (tau_est = 1 + mean leading-correct)."""
import sys, time, json, torch
from qdflash.config import load_config, default_gamma, DrafterConfig
from qdflash.data import load_split
from qdflash.drafter import new_drafter
from qdflash.drafter_train import precompute_features, make_batch, drafter_loss
from qdflash.training import lr_at
from qdflash.models import load_model, load_tokenizer, mask_token_id
runs, out = sys.argv[1], sys.argv[2]
variants = json.loads(sys.argv[3])
tgt = load_model("smol"); tok = load_tokenizer("smol")
base = load_config(DrafterConfig, "smol")
tr = load_split(f"{runs}/00_data", "train"); va = load_split(f"{runs}/00_data", "val")[:200]
t0 = time.time(); ftr = precompute_features(tgt, tr, base.target_layer_ids, 384, bs=64, store_dtype=torch.bfloat16); fva = precompute_features(tgt, va, base.target_layer_ids, 384, bs=64, store_dtype=torch.bfloat16)
print("features", round(time.time() - t0, 1), flush=True)
E, H = tgt.get_input_embeddings(), tgt.get_output_embeddings()
mid = mask_token_id(tok, None)
@torch.no_grad()
def evaluate(d, cfg):
    d.eval(); gen = torch.Generator().manual_seed(123); g = default_gamma(cfg.block_size)
    lead, pos = [], torch.zeros(cfg.block_size - 1); nb = 0; L = 0; n = 0
    for b in range(0, len(va), 4):
        bt = make_batch(va, fva, list(range(b, min(b + 4, len(va)))), cfg.__class__(**{**cfg.__dict__, "num_anchors": 64}), mid, gen, g)
        bt = {k: v.to(d.device) for k, v in bt.items()}
        h = d(E(bt["noise_ids"]), bt["ctx"], bt["q_pos"], bt["ctx_pos"], attn_mask=bt["mask"])
        pred = H(h).argmax(-1); Bk = cfg.block_size
        ok = (pred == bt["labels"]).view(pred.shape[0], -1, Bk)[:, :, 1:]
        valid = (bt["weights"].view(pred.shape[0], -1, Bk)[:, :, 1:] > 0)
        full = valid.all(-1)  # blocks entirely inside the response
        okf = ok[full].float()
        lead.append(okf.cumprod(-1).sum(-1)); pos += okf.cumprod(-1).sum(0).cpu()
    lead = torch.cat(lead); d.train()
    return {"tau_est": round(1 + float(lead.mean()), 3), "per_pos": [round(float(x), 3) for x in pos / len(lead)], "blocks": len(lead)}
res = []
for v in variants:
    cfg = load_config(DrafterConfig, "smol", **{k: x for k, x in v.items() if k not in ("init",)})
    g = default_gamma(cfg.block_size)
    d = new_drafter(tgt, cfg.num_layers, cfg.block_size, cfg.target_layer_ids, mid, seed=0, init=v.get("init", "random")).to(tgt.device)
    opt = torch.optim.AdamW(d.parameters(), lr=cfg.lr, weight_decay=0, betas=(0.9, 0.95))
    spe = len(tr) // cfg.batch_size; total = cfg.epochs * spe; step = 0; t0 = time.time(); curve = []
    for ep in range(cfg.epochs):
        gen = torch.Generator().manual_seed(ep); order = torch.randperm(len(tr), generator=gen).tolist()
        for s in range(spe):
            bt = make_batch(tr, ftr, order[s * cfg.batch_size:(s + 1) * cfg.batch_size], cfg, mid, gen, g)
            for gr in opt.param_groups: gr["lr"] = lr_at(step, total, cfg.warmup_frac, cfg.lr)
            loss, info = drafter_loss(d, E, H, bt); opt.zero_grad(); loss.backward()
            torch.nn.utils.clip_grad_norm_(d.parameters(), 1.0); opt.step(); step += 1
        if ep in (0, cfg.epochs // 2, cfg.epochs - 1) or cfg.epochs <= 6:
            curve.append({"epoch": ep + 1, "loss": round(float(loss.detach()), 3), **evaluate(d, cfg)})
    r = {"variant": v, "train_s": round(time.time() - t0, 1), "steps": total, "curve": curve}
    print(json.dumps(r), flush=True); res.append(r)
    json.dump(res, open(f"{out}/sweep.json", "w"), indent=1)
