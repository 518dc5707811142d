"""Progress of long loops, on the terminal and in notebooks.

The stages call ``tqdm.auto.tqdm``. ``QDFLASH_PROGRESS`` chooses what that shows:

* ``auto`` (default): tqdm's own choice, a widget bar in JupyterLab (ipywidgets) and a bar on a terminal;
* ``text``: one plain line every ``QDFLASH_PROGRESS_EVERY`` percent (default 10) or ``QDFLASH_PROGRESS_SECONDS``
  seconds (default 60), with elapsed time, rate and ETA, written to stderr; loops shorter than
  ``QDFLASH_PROGRESS_MIN_SECONDS`` (default 2) print nothing, and the libraries' own bars (weight loading,
  dataset maps) are turned off. A headless kernel (papermill) forwards
  these lines to the terminal with ``--log-output``, where a widget would show nothing; ``make reproduce`` uses it
  and names the stage through ``QDFLASH_STAGE``;
* ``off``: no progress output.

``install()`` applies the mode; ``qdflash.pipeline.run_stage`` calls it before importing a stage.
"""
from __future__ import annotations

import os
import sys
import time

from tqdm.std import tqdm as _std_tqdm

MODES = ("auto", "text", "off")


class _Sink:
    """Where the underlying tqdm writes its bar in text mode: nowhere (the lines are written separately)."""

    def write(self, s):
        return len(s)

    def flush(self):
        pass


def _fmt_t(s: float | None) -> str:
    return "?" if s is None else _std_tqdm.format_interval(max(0.0, s))


class TextTqdm(_std_tqdm):
    """A tqdm that prints a whole line per progress step (no carriage returns), so logs and papermill keep it."""

    def __init__(self, *args, **kwargs):
        kwargs["file"] = _Sink()
        kwargs.pop("position", None)
        kwargs["mininterval"], kwargs["miniters"] = 0, 1   # every update is checked (the lines are throttled below)
        super().__init__(*args, **kwargs)
        self._every = float(os.environ.get("QDFLASH_PROGRESS_EVERY", "10"))
        self._seconds = float(os.environ.get("QDFLASH_PROGRESS_SECONDS", "60"))
        self._min_s = float(os.environ.get("QDFLASH_PROGRESS_MIN_SECONDS", "2"))
        self._next_pct = self._every
        self._last_line_t = None
        self._last_line_n = -1

    def line(self) -> str:
        """The progress line: ``[stage] desc: 40% 24/60 elapsed 0:12, 2.00 it/s, ETA 0:18 (postfix)``."""
        d = self.format_dict
        n, total, elapsed = d["n"], d["total"], d["elapsed"]
        rate = d["rate"] or (n / elapsed if elapsed > 0 and n else None)
        unit = d.get("unit") or "it"
        stage = os.environ.get("QDFLASH_STAGE")
        head = (f"[{stage}] " if stage else "") + (f"{d['prefix']}: " if d.get("prefix") else "")
        if total:
            eta = (total - n) / rate if rate else None
            body = f"{100.0 * n / total:3.0f}% {n}/{total} {unit}, elapsed {_fmt_t(elapsed)}"
            body += f", {rate:.3g} {unit}/s" if rate else ""
            body += f", ETA {_fmt_t(eta)}"
        else:
            body = f"{n} {unit}, elapsed {_fmt_t(elapsed)}" + (f", {rate:.3g} {unit}/s" if rate else "")
        post = d.get("postfix")
        return head + body + (f" ({post.lstrip(', ')})" if post else "")

    def _line(self) -> None:
        print(self.line(), file=sys.stderr, flush=True)
        self._last_line_t = time.time()
        self._last_line_n = self.n

    def _maybe_line(self) -> None:
        now = time.time()
        if now - self.start_t < self._min_s:
            return
        pct = 100.0 * self.n / self.total if self.total else None
        crossed = pct is not None and pct >= self._next_pct
        while pct is not None and self._next_pct <= pct:
            self._next_pct += self._every
        if self._last_line_t is None or crossed or now - self._last_line_t >= self._seconds:
            self._line()

    def update(self, n=1):
        out = super().update(n)
        if not self.disable:
            self._maybe_line()
        return out

    def close(self):
        if not self.disable and self.n != self._last_line_n and time.time() - self.start_t >= self._min_s:
            self._line()
        super().close()


class OffTqdm(_std_tqdm):
    def __init__(self, *args, **kwargs):
        kwargs["disable"] = True
        super().__init__(*args, **kwargs)


def mode() -> str:
    m = os.environ.get("QDFLASH_PROGRESS", "auto").strip().lower() or "auto"
    if m not in MODES:
        raise ValueError(f"QDFLASH_PROGRESS={m!r} is not one of {MODES}")
    return m


_ORIGINAL: dict = {}


def install(m: str | None = None) -> str:
    """Make ``tqdm.auto.tqdm`` (which the stages import) follow mode ``m`` (default: ``QDFLASH_PROGRESS``)."""
    import tqdm.auto
    import tqdm.autonotebook
    m = m or mode()
    if m not in MODES:
        raise ValueError(f"progress mode {m!r} is not one of {MODES}")
    if not _ORIGINAL:
        _ORIGINAL.update(auto=tqdm.auto.tqdm, autonotebook=tqdm.autonotebook.tqdm)
    cls = {"auto": None, "text": TextTqdm, "off": OffTqdm}[m]
    if m != "auto":        # the libraries' bars (transformers' weight loading, datasets' maps): off
        for var in ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS"):
            os.environ.setdefault(var, "1")
        if "huggingface_hub" in sys.modules:
            sys.modules["huggingface_hub"].utils.disable_progress_bars()
        if "datasets" in sys.modules:
            sys.modules["datasets"].disable_progress_bars()
    tqdm.auto.tqdm = cls or _ORIGINAL["auto"]
    tqdm.autonotebook.tqdm = cls or _ORIGINAL["autonotebook"]
    return m
