"""A GPU run's QAD W4A16 target brought back to this CPU (issue 35 item 9: vLLM on the CPU with the target the GPU
drafters were trained beside), in what fits the device tool's returned files.

Only the quantized Linears differ between two QAD runs of one base model (``qad.py``: embeddings, norms and lm_head
stay full precision and frozen), so the GPU machine sends their packed INT4 codes and scales (~66 MB, ~52 MB gzipped)
with a fingerprint of every other tensor; here they are put into this checkout's own QAD export of the same base model
(the donor), refused unless every other tensor's fingerprint matches, and the dense twin is rebuilt from the codes
(weight = code x its group's scale in fp32, as ``quant.fake_quant``; checked first on the donor's own codes and twin).

    there:  python benchmarks/qad_back.py export RUNS/01_qad OUTDIR       (quant.safetensors + meta.json)
    here:   python benchmarks/qad_back.py rebuild --back OUTDIR --donor runs/smol/01_qad --out runs/smol-xlqad/01_qad

The rebuilt folder is a stage-01 run directory as far as stages 04/05 and ``benchmarks/verify_cost_k.py`` read one
(``metrics.json`` names the QAD export and its twin; it says where the codes came from).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

QUANT_SUFFIXES = (".weight_packed", ".weight_scale", ".weight_shape")


def fingerprint(t) -> str:
    """sha256 of a tensor's dtype, shape and bytes."""
    import torch
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def split_state(state: dict) -> tuple[dict, dict]:
    quant = {k: v for k, v in state.items() if k.endswith(QUANT_SUFFIXES)}
    return quant, {k: v for k, v in state.items() if k not in quant}


def export(run_dir: Path, out: Path) -> dict:
    from safetensors.torch import save_file
    from qdflash.quant import load_state
    from qdflash.runio import provenance, read_json, write_json
    names = read_json(run_dir / "metrics.json")["names"]
    qad = run_dir / names["qad"]
    quant, rest = split_state(load_state(qad))
    out.mkdir(parents=True, exist_ok=True)
    save_file(quant, str(out / "quant.safetensors.tmp"))
    (out / "quant.safetensors.tmp").rename(out / "quant.safetensors")
    meta = {"source": str(qad), "config": json.loads((qad / "config.json").read_text()),
            "other_tensors": {k: fingerprint(v) for k, v in sorted(rest.items())},
            "quant_tensors": len(quant), "provenance": provenance(),
            "qad_metrics": {k: v for k, v in read_json(run_dir / "metrics.json").items() if not isinstance(v, (list,))}}
    write_json(out / "meta.json", meta)
    return meta


def twin_weights(ints: dict, scales: dict, group: int) -> dict:
    """Dense fp32 Linear weights from INT4 codes and per-group scales: code x scale, as ``quant.fake_quant``."""
    import torch
    out = {}
    for name, q in ints.items():
        o, i = q.shape
        s = scales[name].to(torch.float32).reshape(o, i // group, 1)
        out[name] = (q.to(torch.float32).reshape(o, i // group, group) * s).reshape(o, i)
    return out


def rebuild(back: Path, donor: Path, out: Path) -> Path:
    import torch
    from safetensors.torch import save_file
    from qdflash.quant import load_state, read_grid
    from qdflash.runio import provenance, read_json, write_json
    meta = read_json(back / "meta.json")
    dn = read_json(donor / "metrics.json")["names"]
    d_qad, d_twin = donor / dn["qad"], donor / dn["twin"]
    d_cfg = json.loads((d_qad / "config.json").read_text())
    if d_cfg.get("quantization_config") != meta["config"].get("quantization_config"):
        raise SystemExit("rebuild: the donor's quantization_config differs from the brought-back target's")
    d_quant, d_rest = split_state(load_state(d_qad))
    mine = {k: fingerprint(v) for k, v in sorted(d_rest.items())}
    if mine != meta["other_tensors"]:
        bad = sorted(k for k in set(mine) | set(meta["other_tensors"]) if mine.get(k) != meta["other_tensors"].get(k))
        raise SystemExit(f"rebuild: the donor's unquantized tensors differ from the brought-back target's ({bad[:3]})")
    from safetensors.torch import load_file
    quant = load_file(str(back / "quant.safetensors"))
    if set(quant) != set(d_quant):
        raise SystemExit("rebuild: the brought-back quantized tensors are not the donor's set of modules")
    # the twin's rule, checked on the donor first: its own codes must give its own twin exactly
    ints, scales, group, _ = read_grid(d_qad)
    twin_state = load_state(d_twin)
    for name, w in twin_weights(ints, scales, group).items():
        if not torch.equal(w.to(twin_state[name + ".weight"].dtype), twin_state[name + ".weight"]):
            raise SystemExit(f"rebuild: code x scale does not give the donor's own twin at {name}")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    qad_out, twin_out = tmp / dn["qad"], tmp / dn["twin"]
    shutil.copytree(d_qad, qad_out)
    shutil.copytree(d_twin, twin_out)
    for f in list(qad_out.glob("*.safetensors")) + list(twin_out.glob("*.safetensors")):
        f.unlink()
    save_file({**d_rest, **quant}, str(qad_out / "model.safetensors"), metadata={"format": "pt"})
    ints, scales, group, _ = read_grid(qad_out)
    new_twin = dict(twin_state)
    for name, w in twin_weights(ints, scales, group).items():
        new_twin[name + ".weight"] = w.to(twin_state[name + ".weight"].dtype).contiguous()
    changed = sum(not torch.equal(new_twin[k], twin_state[k]) for k in twin_state)
    save_file(new_twin, str(twin_out / "model.safetensors"), metadata={"format": "pt"})
    write_json(tmp / "metrics.json", {
        "names": {"qad": dn["qad"], "twin": dn["twin"]},
        "note": "a GPU run's QAD W4A16 target, its codes and scales brought back by benchmarks/qad_back.py into this "
                "checkout's own QAD export of the same base model (every unquantized tensor checked equal)",
        "donor": str(donor), "brought_back": meta, "twin_tensors_changed": changed, "provenance": provenance()})
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(out)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="the QAD target's codes and scales, with a fingerprint of every other tensor")
    e.add_argument("run_dir", type=Path, help="a stage-01 run directory")
    e.add_argument("out", type=Path)
    r = sub.add_parser("rebuild", help="the brought-back codes put into this checkout's own QAD export, twin rebuilt")
    r.add_argument("--back", type=Path, required=True, help="the folder `export` wrote (quant.safetensors, meta.json)")
    r.add_argument("--donor", type=Path, required=True, help="this checkout's stage-01 run of the same base model")
    r.add_argument("--out", type=Path, required=True, help="the new stage-01 folder (e.g. runs/smol-xlqad/01_qad)")
    a = ap.parse_args()
    if a.cmd == "export":
        m = export(a.run_dir, a.out)
        print(f"exported {m['quant_tensors']} quantized tensors, {len(m['other_tensors'])} others fingerprinted")
    else:
        o = rebuild(a.back, a.donor, a.out)
        print(f"rebuilt {o} ({read_changed(o)} twin tensors from the brought-back codes)")
    return 0


def read_changed(run_dir: Path) -> int:
    return json.loads((run_dir / "metrics.json").read_text())["twin_tensors_changed"]


if __name__ == "__main__":
    raise SystemExit(main())
