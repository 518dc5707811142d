"""Data-parallel training under ``torchrun`` with FSDP2 (``fully_shard``): the glue that lets ``qad.train_qad`` and
``drafter_train.train_drafter`` run on N processes. There is no second trainer: the stage functions call
``current()``, which is None in a plain process (a notebook, the ``qdflash`` command), so that path never touches
``torch.distributed`` and stays what it was.

Launch: ``torchrun --nproc_per_node N --no-python qdflash run 01_qad --preset full --set micro_batch_size=1``. A process
started by torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` set) trains
data-parallel, N = 1 included; the process group is gloo on the CPU and nccl on CUDA (GPU ``LOCAL_RANK``).

The split is over the token stream. Every rank draws the same global batch (same seeded order, same drafter
anchors), keeps its contiguous 1/N of the rows and walks them in micro-batches of ``micro_batch_size`` rows
(gradient accumulation; 0: one micro-batch). Each micro-batch's loss *sum* is divided by the global normaliser
(QAD: the valid tokens of the global batch; drafter: the summed loss weights of the global batch) and multiplied by
N, because FSDP's reduce-scatter averages over ranks. The summed gradient is then the gradient of the one-process
loss on the same global batch. The same holds for the logged loss (all-reduced) and the clipped norm (computed over
the sharded gradients).

Sharded (ZeRO-3: parameters, gradients and AdamW state, 1/N each):

* QAD: the student's trainable tensors (the fp32 latents of the quantized Linears, learned scales), one FSDP unit
  per decoder layer plus the trunk. Its frozen tensors (embeddings, norms, lm_head) are left out of FSDP
  (``ignored_params``) and replicated. The all-gather stays fp32, with no bf16 parameter cast: the INT4 code is
  ``round(latent / scale)`` of the fp32 master value, and a bf16-cast latent would flip codes at other thresholds
  than the packed checkpoint. The compute is bf16 by autocast, as in one process.
* drafter: every drafter tensor, one unit per drafter layer plus the root. Compute is bf16 through
  ``MixedPrecisionPolicy`` (bf16 all-gather, fp32 reduce-scatter) when the preset computes in bf16; master weights
  and AdamW state stay fp32.

Replicated: the frozen teacher (QAD) and target (drafter). Qwen3.5-4B in bf16 is 8.4 GB, about 10% of an 80 GB GPU.
The teacher only runs no-grad forwards, and the target only lends its embedding and lm_head to the loss (its
features are precomputed). Sharding either would save 8.4 (1 - 1/N) GB but cost one all-gather per layer per
forward, with no backward to overlap it with. ``memory_plan`` gives the per-GPU budget that makes this affordable.

Checkpoints go through ``torch.distributed.checkpoint`` (DCP). Each rank writes its shards of the trainable tensors
and their AdamW state into ``<name>.dcp.tmp/``. Rank 0 then writes ``meta.pt`` (step, log, RNG and generator
state) and swaps the directory in. The previous checkpoint is kept as ``.old`` until the swap, so a kill at any point
leaves one complete checkpoint. DCP reshards on load, so a run may resume on another number of processes with the
same global batch. It assumes a file system that every rank sees (one node, or a shared mount).

Only rank 0 writes run files (config, logs, metrics, meta, outputs). Once training's collectives are done, every
rank leaves the process group (``close``): the other ranks return, and rank 0 goes on alone to pack, evaluate and
decode. QAD's PTQ also runs on rank 0 before it joins the group, because llmcompressor turns distributed while a
group exists. The other ranks wait for it in the join (``QDFLASH_DIST_TIMEOUT_MIN``, default 240).
"""
from __future__ import annotations

import datetime
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch
from torch import nn

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
_CURRENT: "DataParallel | None" = None
_CLOSED = False                    # after close(): this process goes on alone (rank 0 packs, evaluates, decodes)


def launched() -> bool:
    """True in a process started by torchrun (or anything that sets its environment variables)."""
    return all(k in os.environ for k in TORCHRUN_ENV)


def current() -> "DataParallel | None":
    """This process's data-parallel context, with the process group initialised on first use; None unless launched
    by torchrun, and None again after ``close``."""
    global _CURRENT
    if _CURRENT is None and launched() and not _CLOSED:
        import torch.distributed as dist

        from .runio import device as default_device
        local = int(os.environ["LOCAL_RANK"])
        cuda = default_device().startswith("cuda")
        if cuda:
            torch.cuda.set_device(local)           # "cuda" (load_model, .to) now means this rank's GPU
        dev = torch.device("cuda", local) if cuda else torch.device("cpu")
        if not dist.is_initialized():
            # generous: rank 0 alone runs PTQ (others wait in this join) and the target features (in a barrier)
            minutes = float(os.environ.get("QDFLASH_DIST_TIMEOUT_MIN", "240"))
            dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(minutes=minutes))
        _CURRENT = DataParallel(dist.get_rank(), dist.get_world_size(), local, dev)
    return _CURRENT


def launch_rank() -> int:
    """This process's rank from torchrun's environment (0 in a plain process), without a process group."""
    return int(os.environ["RANK"]) if launched() else 0


def is_main() -> bool:
    """True where run files are written: a plain process, or rank 0 (from the environment: no process group)."""
    return launch_rank() == 0


def main_first(fn: Callable[[], object], others: Callable[[], object] | None = None) -> object:
    """``fn()`` on rank 0, then ``others()`` (default ``fn()``) on the other ranks: for work that fills a shared
    cache or writes files, which the other ranks then only read."""
    dp = current()
    if dp is None:
        return fn()
    out = fn() if dp.is_main else None
    dp.barrier()
    return out if dp.is_main else (others or fn)()


def check_one_process_batch(batch_size: int, micro_batch_size: int) -> None:
    """Gradient accumulation runs on the data-parallel path only; a plain process trains whole batches."""
    if micro_batch_size and micro_batch_size != batch_size:
        raise ValueError("micro_batch_size (gradient accumulation) runs on the data-parallel path: launch with "
                         "`torchrun --nproc_per_node 1 --no-python qdflash run STAGE ...`")


def is_sharded(t: torch.Tensor) -> bool:
    if not launched():
        return False
    from torch.distributed.tensor import DTensor
    return isinstance(t, DTensor)


def local_rows(t: torch.Tensor, rows: slice | None = None) -> tuple[torch.Tensor, slice]:
    """(this rank's rows, their slice of dim 0) of a tensor FSDP shards on dim 0; of a plain tensor, ``rows`` of
    it (default all)."""
    if not is_sharded(t):
        return (t, slice(None)) if rows is None else (t[rows], rows)
    import torch.distributed as dist
    loc = t.to_local()
    chunk = -(-t.shape[0] // dist.get_world_size())          # torch.chunk sizes, as fully_shard splits dim 0
    lo = min(t.shape[0], dist.get_rank() * chunk)
    if loc.shape[0] != min(t.shape[0], lo + chunk) - lo:
        raise RuntimeError(f"unexpected shard of {tuple(t.shape)}: {tuple(loc.shape)} rows on rank {dist.get_rank()}")
    return loc, slice(lo, lo + loc.shape[0])


@dataclass
class DataParallel:
    rank: int
    world: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------------------------------- collectives
    def barrier(self) -> None:
        import torch.distributed as dist
        dist.barrier()

    def all_sum(self, values: Iterable[float]) -> list[float]:
        """Elementwise sum over ranks (float64: integer counts stay exact)."""
        import torch.distributed as dist
        t = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def broadcast(self, value: float) -> float:
        """Rank 0's value on every rank (keeps decisions such as the best QAD step identical across ranks)."""
        import torch.distributed as dist
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.broadcast(t, 0)
        return float(t.item())

    def close(self) -> None:
        """Leave the process group for good (``current()`` is None from here on)."""
        global _CURRENT, _CLOSED
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()
        _CURRENT, _CLOSED = None, True

    # ------------------------------------------------------------------------------------------- data
    def micro_slices(self, n: int, micro: int) -> list[slice]:
        """This rank's micro-batches of a global batch of ``n`` rows: its contiguous 1/world of the rows, in slices of
        ``micro`` rows (0: one slice)."""
        if n % self.world:
            raise ValueError(f"batch_size {n} is not divisible by the {self.world} processes")
        per = n // self.world
        micro = micro or per
        if per % micro:
            raise ValueError(f"micro_batch_size {micro} does not divide the {per} rows per process "
                             f"(batch_size {n} over {self.world} processes)")
        lo = self.rank * per
        return [slice(lo + i, lo + i + micro) for i in range(0, per, micro)]

    def micro_batches(self, batch: dict[str, torch.Tensor], micro: int) -> list[dict[str, torch.Tensor]]:
        """This rank's micro-batches of a collated global batch (``micro_slices`` of its rows), each without the
        padding columns none of its rows needs (right padding, causal model: the kept tokens see the same)."""
        out = []
        for sl in self.micro_slices(len(batch["attention_mask"]), micro):
            part = {k: v[sl] for k, v in batch.items()}
            width = int(part["attention_mask"].sum(1).max())
            out.append({k: v[:, :width] for k, v in part.items()})
        return out

    def accumulate(self, parts: list, loss_of: Callable[[object], torch.Tensor]) -> float:
        """Forward and backward of each micro-batch in ``parts`` (gradients accumulate). ``loss_of(part)`` is the part's
        loss sum already divided by the *global* normaliser. Its backward is scaled by the world size because FSDP's
        reduce-scatter averages over ranks. Returns the global batch's loss (all-reduced)."""
        local = 0.0
        for part in parts:
            loss = loss_of(part)
            (loss * self.world).backward()
            local += float(loss.detach())
        return self.all_sum([local])[0]

    # ------------------------------------------------------------------------------------------- sharding
    def check_replicas(self, tensors: Iterable[torch.Tensor], what: str) -> None:
        """Every rank must start from the same weights (fully_shard keeps each rank's slice of its own copy)."""
        import torch.distributed as dist
        s = sum(float(t.detach().double().sum()) + float(t.detach().double().abs().sum()) for t in tensors)
        t = torch.tensor([s, -s], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        hi, lo = float(t[0]), -float(t[1])
        if hi - lo > 1e-12 * max(1.0, abs(s)):
            raise RuntimeError(f"{what} differs between ranks (checksums {lo!r} .. {hi!r}); seed the init")

    def shard(self, model: nn.Module, units: Iterable[nn.Module], root: nn.Module | None = None,
              param_dtype: torch.dtype | None = None) -> None:
        """``fully_shard`` each unit, then ``root`` (default ``model``), in place. Frozen parameters of ``model``
        are left out (replicated); ``param_dtype`` bf16 = bf16 all-gather and compute, fp32 reduce-scatter."""
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        frozen = {p for p in model.parameters() if not p.requires_grad}
        self.check_replicas([p for p in model.parameters() if p.requires_grad], "the trainable initialisation")
        mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
        for u in units:
            fully_shard(u, mp_policy=mp, ignored_params=frozen)
        fully_shard(root if root is not None else model, mp_policy=mp, ignored_params=frozen)

    def clip_grad_norm(self, params: list[torch.Tensor], max_norm: float) -> float:
        """``clip_grad_norm_`` over sharded gradients: the norm of the full gradient, the same on every rank."""
        n = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return float(n.full_tensor() if is_sharded(n) else n)

    def unsharded(self, model: nn.Module, build: Callable[[], nn.Module]) -> nn.Module | None:
        """The trained tensors gathered (collective) into a plain module from ``build()`` on rank 0; None elsewhere."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True,
                                                                    ignore_frozen_params=True))
        if not self.is_main:
            return None
        with torch.random.fork_rng(devices=[]):   # building the shell must not move the stage's RNG
            plain = build()
        unexpected = plain.load_state_dict(full, strict=False).unexpected_keys
        if unexpected or not full:
            raise RuntimeError(f"gathered state does not fit the plain module: unexpected {unexpected[:5]}")
        return plain.to(self.device)

    # ------------------------------------------------------------------------------------------- checkpoints
    def save(self, path: Path, model: nn.Module, opt: torch.optim.Optimizer, meta: dict,
             extra: dict[str, torch.Tensor] | None = None, log_path: Path | None = None) -> None:
        """Sharded checkpoint of ``model``'s trainable tensors, ``opt`` and ``extra`` (DCP) plus ``meta`` (rank 0),
        then (rank 0) ``meta["log"]`` as jsonl to ``log_path``."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
        msd, osd = get_state_dict(model, opt, options=StateDictOptions(ignore_frozen_params=True))
        tmp, old = path.with_name(path.name + ".tmp"), path.with_name(path.name + ".old")
        if self.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        self.barrier()
        dcp.save({"model": msd, "optim": osd, **({"extra": extra} if extra else {})}, checkpoint_id=tmp)
        if self.is_main:
            torch.save(meta, tmp / "meta.pt")                  # written last: marks the directory complete
            if (path / "meta.pt").exists():
                shutil.rmtree(old, ignore_errors=True)
                path.rename(old)
            shutil.rmtree(path, ignore_errors=True)
            tmp.rename(path)
            shutil.rmtree(old, ignore_errors=True)
            if log_path is not None:
                from .runio import write_jsonl
                write_jsonl(log_path, meta["log"])
        self.barrier()

    @staticmethod
    def checkpoint_dir(path: Path) -> Path | None:
        """The complete checkpoint at ``path`` (or the previous one, when a kill hit the swap), else None."""
        for p in (path, path.with_name(path.name + ".old")):
            if (p / "meta.pt").exists():
                return p
        return None

    def load(self, path: Path, model: nn.Module, opt: torch.optim.Optimizer, one_process: Path,
             extra: Callable[[dict], dict[str, torch.Tensor]] | None = None) -> tuple[dict, dict] | None:
        """Restore ``model`` and ``opt`` in place from ``save``; returns (meta, extra tensors), or None when there is
        no checkpoint. ``extra(meta)`` gives the templates (shapes, shards) of the extra tensors to read. A run with
        only the one-process checkpoint ``one_process`` is refused rather than restarted."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
        d = self.checkpoint_dir(path)
        if d is None and one_process.exists():
            raise ValueError(f"{one_process} is a one-process checkpoint: resume it without torchrun, or delete it")
        if d is None:
            return None
        try:
            meta = torch.load(d / "meta.pt", map_location="cpu", weights_only=False)
        except Exception as e:
            raise ValueError(f"checkpoint {d} is corrupt; delete it to restart: {e}") from e
        opts = StateDictOptions(ignore_frozen_params=True)
        msd, osd = get_state_dict(model, opt, options=opts)
        ext = extra(meta) if extra else {}
        state = {"model": msd, "optim": osd, **({"extra": ext} if ext else {})}
        try:
            dcp.load(state, checkpoint_id=d)
        except Exception as e:
            raise ValueError(f"checkpoint {d} does not fit this run (other trainable tensors?); delete it to "
                             f"restart: {e}") from e
        # the frozen tensors are not in the checkpoint; dcp.load above failed unless every trainable one was
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=StateDictOptions(ignore_frozen_params=True, strict=False))
        return meta, state.get("extra", {})
