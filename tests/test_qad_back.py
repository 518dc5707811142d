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


def check_round_trip(qad_run: Path, tmp: Path) -> None:
    from safetensors.torch import load_file, save_file
    from qdflash.quant import load_state, read_grid
    qb = _mod()
    names = json.loads((qad_run / "metrics.json").read_text())["names"]
    back = tmp / "back"
    meta = qb.export(qad_run, back)
    sent = load_file(str(back / "quant.safetensors"))
    assert sent and all(k.endswith(qb.QUANT_SUFFIXES) for k in sent)          # codes and scales only
    assert meta["other_tensors"] and not set(meta["other_tensors"]) & set(sent)

    # its own codes back into itself: the same QAD export and the same twin, tensor for tensor
    out = qb.rebuild(back, qad_run, tmp / "same" / "01_qad")
    for sub in (names["qad"], names["twin"]):
        a, b = load_state(qad_run / sub), load_state(out / sub)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((out / "metrics.json").read_text())["twin_tensors_changed"] == 0

    # another target's codes (one module's codes moved by one step, within the INT4 range): the twin follows them
    ints, scales, group, bits = read_grid(qad_run / names["qad"])
    name = sorted(ints)[0]
    q = ints[name].clone()
    q[0, 0] = 1 if q[0, 0] < 1 else q[0, 0] - 1
    from qdflash.quant import packed_tensors
    moved = dict(sent)
    moved[name + ".weight_packed"] = packed_tensors(name, q, scales[name], bits)[name + ".weight_packed"]
    save_file(moved, str(back / "quant.safetensors"))
    out = qb.rebuild(back, qad_run, tmp / "moved" / "01_qad")
    twin, was = load_state(out / names["twin"]), load_state(qad_run / names["twin"])
    changed = [k for k in was if not torch.equal(was[k], twin[k])]
    assert changed == [name + ".weight"]
    w = twin[name + ".weight"]
    assert w[0, 0].item() == pytest.approx(q[0, 0].item() * scales[name][0, 0].item())
    assert torch.equal(w[1:], was[name + ".weight"][1:])

    # a donor whose unquantized tensors differ (another base model) is refused
    meta["other_tensors"][next(iter(meta["other_tensors"]))] = "0" * 64
    (back / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(SystemExit, match="unquantized tensors differ"):
        qb.rebuild(back, qad_run, tmp / "refused" / "01_qad")
    assert not (tmp / "refused" / "01_qad").exists()


def test_qad_back_round_trip_and_refusal(tiny_pipeline, tmp_path):
    check_round_trip(tiny_pipeline["runs"] / "01_qad", tmp_path)
