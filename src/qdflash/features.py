"""One on-disk cache of target hidden-state features (the DFlash drafter's context), shared by stages 02-04.

Features of a row are ``target_features(hidden_states, layer_ids)`` over its first ``max_len`` tokens: the
concatenated outputs of the target layers the drafter reads, [len, n_layers * hidden]. They depend only on
(target weights, layer ids, token ids, max_len, compute dtype), so they are computed once per such tuple and
stored under ``<cache>/features/<key>/``, where ``key`` hashes exactly those inputs (the target by the sha256 of its
weight files, the rows by their token ids). A changed target or data set gets a new key; a rerun with the same
inputs computes nothing.

Layout: ``shard-NNNNN.bin`` holds the bf16 features of a contiguous range of rows, flat [tokens, dim] (raw
int16 bits), ``shard-NNNNN.json`` its row offsets; a shard is written to a temporary file and renamed, then its json,
so a killed run resumes at the first shard without a json. ``index.json`` marks the cache complete. Reading
memory-maps the shards: a 50K-conversation cache need not fit in RAM.
"""
from __future__ import annotations

import bisect
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch

from .runio import atomic_write_text, cache_dir, read_json, write_json

VERSION = 1
SHARD_ROWS = 256


def weights_sha256(model_dir: str | Path) -> str:
    """sha256 over the weight files of a model directory, memoised by (path, size, mtime) in the cache."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir}: cannot fingerprint the target")
    memo_path = cache_dir() / "weights_sha256.json"
    memo = json.loads(memo_path.read_text()) if memo_path.exists() else {}
    stamp = json.dumps([[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files])
    key = hashlib.sha256(stamp.encode()).hexdigest()
    if key not in memo:
        h = hashlib.sha256()
        for f in files:
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 22), b""):
                    h.update(chunk)
        memo[key] = h.hexdigest()
        atomic_write_text(memo_path, json.dumps(memo, indent=1))
    return memo[key]


def rows_sha256(rows: list[dict], max_len: int) -> str:
    h = hashlib.sha256()
    for r in rows:
        h.update(json.dumps(r["input_ids"][:max_len]).encode())
        h.update(b"\n")
    return h.hexdigest()


def feature_key(target_dir: str | Path, layer_ids, rows: list[dict], max_len: int, dtype: str) -> str:
    spec = {"v": VERSION, "target": weights_sha256(target_dir), "layers": [int(i) for i in layer_ids],
            "rows": rows_sha256(rows, max_len), "max_len": int(max_len), "dtype": dtype, "shard_rows": SHARD_ROWS}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:32]


class FeatureStore:
    """Read-only, memory-mapped features: ``store[i]`` is row i's tensor [len_i, dim] (bf16)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        idx = read_json(self.path / "index.json")
        self.dim, self.n = int(idx["dim"]), int(idx["rows"])
        self._shards = []                      # (first_row, offsets, file)
        for sh in idx["shards"]:
            meta = read_json(self.path / sh)
            self._shards.append((meta["first_row"], meta["offsets"], self.path / meta["file"]))
        self._maps: dict[int, np.memmap] = {}
        self.computed_rows = 0                 # rows computed by the call that returned this store

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if not 0 <= i < self.n:
            raise IndexError(i)
        s = bisect.bisect_right([sh[0] for sh in self._shards], i) - 1
        first, offs, f = self._shards[s]
        if not 0 <= i - first < len(offs) - 1:
            raise IndexError(f"row {i} is not in shard {s} of {self.path} (rows {first}..{first + len(offs) - 2})")
        if s not in self._maps:
            self._maps[s] = np.memmap(f, dtype=np.int16, mode="r").reshape(-1, self.dim)
        a, b = offs[i - first], offs[i - first + 1]
        return torch.from_numpy(np.array(self._maps[s][a:b])).view(torch.bfloat16)


def right_padded(seqs: list[list[int]], n_rows: int | None = None, width: int | None = None):
    """(ids, attention mask) [n_rows, width] long with ``seqs`` right-padded (defaults: as many rows as ``seqs``, the
    longest one's length). The target is causal, so padding after a row never changes its features (up to
    batched-matmul rounding)."""
    n_rows, width = n_rows or len(seqs), width or max(len(x) for x in seqs)
    ids = torch.zeros((n_rows, width), dtype=torch.long)
    att = torch.zeros((n_rows, width), dtype=torch.long)
    for r, x in enumerate(seqs):
        ids[r, : len(x)] = torch.tensor(x)
        att[r, : len(x)] = 1
    return ids, att


def forward_features(target, ids: torch.Tensor, att: torch.Tensor, layer_ids) -> torch.Tensor:
    """The concatenated hidden states at ``layer_ids`` (``drafter.target_features``) of one padded batch.
    logits_to_keep=1: the features are hidden states; the full-vocabulary logits of every position (49K x tokens for
    smol) would be computed and written only to be dropped."""
    from .drafter import target_features
    hs = target(input_ids=ids, attention_mask=att, output_hidden_states=True, logits_to_keep=1).hidden_states
    return target_features(hs, layer_ids)


@torch.no_grad()
def compute_features(target, rows: list[dict], layer_ids, max_len: int, bs: int = 8,
                     progress: bool = False, on_device: bool = False) -> list[torch.Tensor]:
    """Target features of ``rows``' first ``max_len`` tokens, in the target's dtype (on the CPU unless
    ``on_device``). Rows are batched with *right* padding by similar length (``right_padded``)."""
    from tqdm.auto import tqdm
    out: list = [None] * len(rows)
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]["input_ids"]))
    for b in tqdm(range(0, len(order), bs), desc="target features", disable=not progress):
        idx = order[b: b + bs]
        seqs = [rows[i]["input_ids"][:max_len] for i in idx]
        ids, att = right_padded(seqs)
        f = forward_features(target, ids.to(target.device), att.to(target.device), layer_ids)
        f = f if on_device else f.cpu()
        for r, i in enumerate(idx):
            out[i] = f[r, : len(seqs[r])].clone()
    return out


def cached_features(target, target_dir: str | Path, rows: list[dict], layer_ids, max_len: int, dtype: str,
                    bs: int = 8, progress: bool = False) -> FeatureStore:
    """The features of ``rows`` for ``target`` (loaded from ``target_dir`` in ``dtype``), from the cache or computed
    now (resuming a killed computation shard by shard)."""
    from tqdm.auto import tqdm
    key = feature_key(target_dir, layer_ids, rows, max_len, dtype)
    root = cache_dir() / "features" / key
    if (root / "index.json").exists():
        return FeatureStore(root)
    root.mkdir(parents=True, exist_ok=True)
    n_shards = (len(rows) + SHARD_ROWS - 1) // SHARD_ROWS
    shards, computed, dim = [], 0, None
    bar = tqdm(total=len(rows), desc="target features", disable=not progress)
    for s in range(n_shards):
        lo, hi = s * SHARD_ROWS, min(len(rows), (s + 1) * SHARD_ROWS)
        meta_name = f"shard-{s:05d}.json"
        if (root / meta_name).exists():          # a shard of a killed run: keep it only if it is this row range
            meta = read_json(root / meta_name)
            if meta["first_row"] != lo or len(meta["offsets"]) != hi - lo + 1:
                (root / meta_name).unlink()
        if not (root / meta_name).exists():
            feats = compute_features(target, rows[lo:hi], layer_ids, max_len, bs)
            flat = torch.cat(feats).to(torch.bfloat16).contiguous()
            offs = np.cumsum([0] + [f.shape[0] for f in feats]).tolist()
            tmp = root / f".shard-{s:05d}.bin.tmp"
            flat.view(torch.int16).numpy().tofile(tmp)
            os.replace(tmp, root / f"shard-{s:05d}.bin")
            write_json(root / meta_name, {"first_row": lo, "offsets": offs, "file": f"shard-{s:05d}.bin",
                                          "dim": flat.shape[1]})
            computed += hi - lo
        dim = read_json(root / meta_name)["dim"]
        shards.append(meta_name)
        bar.update(hi - lo)
    bar.close()
    write_json(root / "index.json", {"rows": len(rows), "dim": dim, "shards": shards, "max_len": max_len,
                                     "layer_ids": list(layer_ids), "dtype": dtype, "target_dir": str(target_dir),
                                     "computed_rows": computed})
    store = FeatureStore(root)
    store.computed_rows = computed
    return store


class OnlineFeatures:
    """Features computed per training batch by the target's forward and never stored: for a GPU, where one forward
    of a small target costs less than reading its features back, or a data set whose cache would not fit on disk
    (bf16 features take ``n_layers * hidden * 2`` bytes a token: 5.8 KB for ``smol``, 50 GB for 24K conversations
    of 360 tokens). ``prefetch(idx)`` computes one batch; ``store[i]`` then returns row ``i`` of it.

    ``static=True`` (``DrafterConfig.compile_features``): every batch is right-padded to the largest batch seen x
    ``max_len`` tokens (``right_padded``; the target is causal: padding after a row changes none of its features) and the target's
    forward is ``torch.compile``d for that one shape (mode ``reduce-overhead``: CUDA graphs on a GPU), so that a
    step no longer waits on the host launching the eager forward's kernels one by one (measured: the drafter step is
    host-bound, benchmarks/smol-gpu-xl/run-1206b-h100)."""
    path = None

    def __init__(self, target, rows: list[dict], layer_ids, max_len: int, static: bool = False):
        self.target, self.rows, self.layer_ids, self.max_len = target, rows, tuple(layer_ids), max_len
        self.computed_rows, self._cur, self.static = 0, {}, bool(static)
        self._fwd, self._width, self._padded = None, 0, None

    def prefetch(self, idx: list[int]) -> None:
        with torch.no_grad():
            if not self.static:
                feats = compute_features(self.target, [self.rows[i] for i in idx], self.layer_ids, self.max_len,
                                         bs=len(idx), on_device=True)
            else:
                self._width = max(self._width, len(idx))
                if self._fwd is None:
                    self._fwd = torch.compile(forward_features, mode="reduce-overhead", dynamic=False)
                dev = self.target.device
                seqs = [self.rows[i]["input_ids"][: self.max_len] for i in idx]
                ids, att = right_padded(seqs, self._width, self.max_len)
                # clone: the graph's output buffer is reused by its next replay
                f = self._fwd(self.target, ids.to(dev), att.to(dev), self.layer_ids).clone()
                feats = [f[r, : len(x)] for r, x in enumerate(seqs)]
                self._padded = (list(idx), f, torch.tensor([len(x) for x in seqs], device=f.device))
        self._cur = dict(zip(idx, feats))
        self.computed_rows += len(idx)

    def padded_batch(self, idx: list[int], width: int) -> torch.Tensor | None:
        """The prefetched batch ``idx`` as one [len(idx), width, hidden] tensor, row r's features in its first
        len(row) positions and zeros after (what ``make_batch`` would assemble row by row), without a copy per row;
        None unless the batch came from the compiled (``static``) forward."""
        if self._padded is None or self._padded[0] != list(idx):
            return None
        _, f, lens = self._padded
        f = f[: len(idx), :width]
        return f * (torch.arange(width, device=f.device)[None, :] < lens[:, None])[..., None].to(f.dtype)

    def __getitem__(self, i: int) -> torch.Tensor:
        if i not in self._cur:
            raise KeyError(f"row {i} is not in the prefetched batch (call prefetch first)")
        return self._cur[i]

    def __len__(self) -> int:
        return len(self.rows)
