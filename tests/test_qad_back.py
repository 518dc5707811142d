"""benchmarks/qad_back.py: a QAD target's INT4 codes sent without its unquantized tensors and put back into another
export of the same base model. The tiny pipeline's stage 01 stands in for both machines."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def _mod():
    spec = importlib.util.spec_from_file_location("qad_back", REPO / "benchmarks" / "qad_back.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _refused(qb, back: Path, donor: Path, out: Path, match: str) -> None:
    with pytest.raises(SystemExit, match=match):
        qb.rebuild(back, donor, out)
    assert not out.exists() and not out.with_name(out.name + ".tmp").exists()


def check_round_trip(qad_run: Path, tmp: Path) -> None:
    import shutil

    from safetensors.torch import load_file, save_file
    from qdflash.quant import load_state, packed_tensors, read_grid
    qb = _mod()
    names = json.loads((qad_run / "metrics.json").read_text())["names"]
    back = tmp / "back"
    meta = qb.export(qad_run, back)
    sent = load_file(str(back / "quant.safetensors"))
    assert sent and all(k.endswith(qb.QUANT_SUFFIXES) for k in sent)          # codes and scales only
    assert meta["other_tensors"] and not set(meta["other_tensors"]) & set(sent)

    # its own codes back into itself: the same QAD export and the same twin, tensor for tensor, checked against the
    # exporting side's twin fingerprints
    out, changed = qb.rebuild(back, qad_run, tmp / "same" / "01_qad")
    for sub in (names["qad"], names["twin"]):
        a, b = load_state(qad_run / sub), load_state(out / sub)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert changed == 0 and json.loads((out / "metrics.json").read_text())["twin_checked_against_export"]

    # another target's codes (one module's codes moved by one step, within the INT4 range): the QAD export carries
    # them and the twin follows them (an export without twin fingerprints, as before they were recorded)
    ints, scales, group, bits = read_grid(qad_run / names["qad"])
    name = sorted(ints)[0]
    q = ints[name].clone()
    q[0, 0] = 1 if q[0, 0] < 1 else q[0, 0] - 1
    moved_back = tmp / "moved_back"
    shutil.copytree(back, moved_back)
    moved = dict(sent)
    moved[name + ".weight_packed"] = packed_tensors(name, q, scales[name], bits)[name + ".weight_packed"]
    save_file(moved, str(moved_back / "quant.safetensors"))
    m = {k: v for k, v in meta.items() if k not in ("quant_fingerprints", "twin_fingerprints")}
    (moved_back / "meta.json").write_text(json.dumps(m))
    out, changed = qb.rebuild(moved_back, qad_run, tmp / "moved" / "01_qad")
    assert torch.equal(read_grid(out / names["qad"])[0][name], q)
    twin, was = load_state(out / names["twin"]), load_state(qad_run / names["twin"])
    assert [k for k in was if not torch.equal(was[k], twin[k])] == [name + ".weight"] and changed == 1
    w = twin[name + ".weight"]
    assert w[0, 0].item() == pytest.approx(q[0, 0].item() * scales[name][0, 0].item())
    assert torch.equal(w[1:], was[name + ".weight"][1:])

    # refusals, nothing written: the moved codes against the exporting side's twin and quant fingerprints; a donor of
    # another base model (one unquantized tensor changed), another quantization config, another set of modules, a
    # donor whose twin is not code x scale
    save_file(moved, str(back / "quant.safetensors"))
    _refused(qb, back, qad_run, tmp / "r1" / "01_qad", "not the file its meta.json describes")
    m = {k: v for k, v in meta.items() if k != "quant_fingerprints"}
    (back / "meta.json").write_text(json.dumps(m))
    _refused(qb, back, qad_run, tmp / "r2" / "01_qad", "differs from the exporting machine's")
    save_file(sent, str(back / "quant.safetensors"))
    (back / "meta.json").write_text(json.dumps(meta))
    other = tmp / "other_donor"
    shutil.copytree(qad_run, other, ignore=shutil.ignore_patterns("qad-ckpt", "ptq-*"))
    st = load_state(other / names["qad"])
    key = next(k for k in sorted(st) if not k.endswith(qb.QUANT_SUFFIXES))
    st[key] = st[key] + 1
    save_file(st, str(other / names["qad"] / "model.safetensors"))
    _refused(qb, back, other, tmp / "r3" / "01_qad", "unquantized tensors differ")
    (back / "meta.json").write_text(json.dumps({**meta, "config": {**meta["config"], "quantization_config": {}}}))
    _refused(qb, back, qad_run, tmp / "r4" / "01_qad", "quantization_config differs")
    (back / "meta.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "quant_fingerprints"}))
    save_file({k: v for k, v in sent.items() if not k.startswith(name + ".")}, str(back / "quant.safetensors"))
    _refused(qb, back, qad_run, tmp / "r5" / "01_qad", "not the donor's modules")
    save_file(sent, str(back / "quant.safetensors"))
    (back / "meta.json").write_text(json.dumps(meta))
    shutil.copytree(qad_run, tmp / "bad_twin", ignore=shutil.ignore_patterns("qad-ckpt", "ptq-*"))
    tw = load_state(tmp / "bad_twin" / names["twin"])
    tw[name + ".weight"] = tw[name + ".weight"] * 1.5
    save_file(tw, str(tmp / "bad_twin" / names["twin"] / "model.safetensors"))
    _refused(qb, back, tmp / "bad_twin", tmp / "r6" / "01_qad", "does not give the donor's own twin")


def test_qad_back_round_trip_and_refusal(tiny_pipeline, tmp_path):
    check_round_trip(tiny_pipeline["runs"] / "01_qad", tmp_path)
