"""A saved drafter (a ``drafter-*`` directory of stage 02/03/04) with its floating-point tensors cast to bf16, to carry
off the GPU machine (the device tool returns at most 64 MiB a call); the CPU side loads it like any saved drafter.

    python3 benchmarks/drafter_bf16.py SRC_DRAFTER_DIR DST_DIR
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path


def to_bf16(src: Path, dst: Path) -> Path:
    import torch
    from safetensors.torch import load_file, save_file
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix == ".safetensors":
            save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in load_file(f).items()},
                      dst / f.name)
        elif f.is_file():
            shutil.copy(f, dst / f.name)
    return dst


if __name__ == "__main__":
    if len(sys.argv) != 3 or not Path(sys.argv[1]).is_dir():
        sys.exit("usage: drafter_bf16.py SRC_DRAFTER_DIR DST_DIR (SRC must be a saved drafter directory)")
    print(to_bf16(Path(sys.argv[1]), Path(sys.argv[2])))
