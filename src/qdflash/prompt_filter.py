"""The filter every prompt source applies: 16-1200 characters, English (ASCII letters), not seen before."""
from __future__ import annotations


def english_like(s: str) -> bool:
    letters = sum(c.isalpha() for c in s)
    return letters > 0 and sum(c.isascii() and c.isalpha() for c in s) / letters > 0.97


def keep_prompt(p: str, seen: set) -> bool:
    """True (and ``p`` recorded in ``seen``) for a prompt of 16-1200 characters, English-like, not in ``seen``."""
    if 16 <= len(p) <= 1200 and english_like(p) and p not in seen:
        seen.add(p)
        return True
    return False
