"""A GPU run's QAD W4A16 target brought back to this CPU (issue 35 item 9: vLLM on the CPU with the target the GPU
drafters were trained beside), in what fits the device tool's returned files.

Only the quantized Linears differ between two QAD runs of one base model (``qad.py``: embeddings, norms and lm_head
stay full precision and frozen), so the GPU machine sends their packed INT4 codes and scales (~66 MB, ~52 MB gzipped)
with a fingerprint of every other tensor; here they are put into this checkout's own QAD export of the same base model
(the donor), refused unless every other tensor's fingerprint matches, and the dense twin is rebuilt from the codes
(weight = code x its group's scale in fp32, ``quant.dequantize``: checked first on the donor's own codes and twin, and
against the exporting machine's twin where the export carries its fingerprints).

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
    h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def split_state(state: dict) -> tuple[dict, dict]:
    quant = {k: v for k, v in state.items() if k.endswith(QUANT_SUFFIXES)}
    return quant, {k: v for k, v in state.items() if k not in quant}


def export(run_dir: Path, out: Path) -> dict:
    from safetensors.torch import save_file
    from qdflash.quant import load_state
    from qdflash.runio import provenance, read_json, write_json
    metrics = read_json(run_dir / "metrics.json")
    qad, twin = run_dir / metrics["names"]["qad"], run_dir / metrics["names"]["twin"]
    quant, rest = split_state(load_state(qad))
    out.mkdir(parents=True, exist_ok=True)
    save_file(quant, str(out / "quant.safetensors.tmp"))
    (out / "quant.safetensors.tmp").rename(out / "quant.safetensors")
    meta = {"source": str(qad), "config": json.loads((qad / "config.json").read_text()),
            "other_tensors": {k: fingerprint(v) for k, v in sorted(rest.items())},
            "quant_fingerprints": {k: fingerprint(v) for k, v in sorted(quant.items())},
            "twin_fingerprints": {k: fingerprint(v) for k, v in sorted(load_state(twin).items())},
            "quant_tensors": len(quant), "provenance": provenance(),
            "qad_metrics": {k: v for k, v in metrics.items() if not isinstance(v, list)}}
    write_json(out / "meta.json", meta)
    return meta


def twin_weights(ints: dict, scales: dict, group: int) -> dict:
    """Dense fp32 Linear weights from INT4 codes and per-group scales: code x scale (``quant.dequantize``), what the
    student's fake-quantized weight is wherever its latent's STE arithmetic is exact (checked, see ``rebuild``)."""
    import torch
    from qdflash.quant import dequantize
    return {name: dequantize(q.to(torch.float32), scales[name].to(torch.float32), group) for name, q in ints.items()}


def rebuild(back: Path, donor: Path, out: Path) -> tuple[Path, int]:
    """(the new stage-01 folder, how many twin tensors the brought-back codes changed). Refused, with nothing
    written, when the donor is another base model or recipe (quantization config, unquantized tensors, quantized
    modules, shapes or dtypes differ), when the brought-back file is not the one its meta describes, when code x scale
    does not give the donor's own twin, or when the rebuilt twin differs from the exporting machine's (exports that
    carry its fingerprints)."""
    import torch
    from safetensors.torch import load_file, save_file
    from qdflash.quant import load_state, read_grid
    from qdflash.runio import provenance, read_json, write_json
    meta = read_json(back / "meta.json")
    donor_names = read_json(donor / "metrics.json")["names"]
    d_qad, d_twin = donor / donor_names["qad"], donor / donor_names["twin"]
    d_cfg = json.loads((d_qad / "config.json").read_text())
    if d_cfg.get("quantization_config") != meta["config"].get("quantization_config"):
        raise SystemExit("rebuild: the donor's quantization_config differs from the brought-back target's")
    d_quant, d_rest = split_state(load_state(d_qad))
    donor_fingerprints = {k: fingerprint(v) for k, v in sorted(d_rest.items())}
    if donor_fingerprints != meta["other_tensors"]:
        bad = sorted(k for k in set(donor_fingerprints) | set(meta["other_tensors"])
                     if donor_fingerprints.get(k) != meta["other_tensors"].get(k))
        raise SystemExit(f"rebuild: the donor's unquantized tensors differ from the brought-back target's ({bad[:3]})")
    quant = load_file(str(back / "quant.safetensors"))
    if set(quant) != set(d_quant) or any((v.shape, v.dtype) != (d_quant[k].shape, d_quant[k].dtype)
                                         for k, v in quant.items()):
        raise SystemExit("rebuild: the brought-back quantized tensors are not the donor's modules, shapes and dtypes")
    if "quant_fingerprints" in meta and {k: fingerprint(v) for k, v in sorted(quant.items())} != meta["quant_fingerprints"]:
        raise SystemExit("rebuild: quant.safetensors is not the file its meta.json describes")
    # the twin's rule, checked on the donor first: its own codes must give its own twin exactly
    ints, scales, group, _ = read_grid(d_qad)
    twin_state = load_state(d_twin)
    for name, w in twin_weights(ints, scales, group).items():
        if not torch.equal(w.to(twin_state[name + ".weight"].dtype), twin_state[name + ".weight"]):
            raise SystemExit(f"rebuild: code x scale does not give the donor's own twin at {name}")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    qad_out, twin_out = tmp / donor_names["qad"], tmp / donor_names["twin"]
    shutil.copytree(d_qad, qad_out)
    shutil.copytree(d_twin, twin_out)
    for f in [f for d in (qad_out, twin_out) for pat in ("*.safetensors", "*.safetensors.index.json") for f in d.glob(pat)]:
        f.unlink()
    save_file({**d_rest, **quant}, str(qad_out / "model.safetensors"), metadata={"format": "pt"})
    ints, scales, group, _ = read_grid(qad_out)
    new_twin = dict(twin_state)
    for name, w in twin_weights(ints, scales, group).items():
        new_twin[name + ".weight"] = w.to(twin_state[name + ".weight"].dtype).contiguous()
    theirs = meta.get("twin_fingerprints")
    if theirs is not None:           # the exporting machine's own twin (dtype included: a donor of another dtype fails)
        mine = {k: fingerprint(v) for k, v in sorted(new_twin.items())}
        bad = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        if bad:
            shutil.rmtree(tmp, ignore_errors=True)
            raise SystemExit(f"rebuild: the rebuilt twin differs from the exporting machine's ({bad[:3]})")
    changed = sum(not torch.equal(new_twin[k], twin_state[k]) for k in twin_state)
    save_file(new_twin, str(twin_out / "model.safetensors"), metadata={"format": "pt"})
    write_json(tmp / "metrics.json", {
        "names": {"qad": donor_names["qad"], "twin": donor_names["twin"]},
        "note": "a GPU run's QAD W4A16 target, its codes and scales brought back by benchmarks/qad_back.py into this "
                "checkout's own QAD export of the same base model (every unquantized tensor checked equal)",
        "donor": str(donor), "brought_back": meta, "twin_tensors_changed": changed,
        "twin_checked_against_export": theirs is not None, "provenance": provenance()})
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(out)
    return out, changed


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
        o, changed = rebuild(a.back, a.donor, a.out)
        print(f"rebuilt {o} ({changed} twin tensors from the brought-back codes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
