"""Byte counts that requests give in their headers."""

from __future__ import annotations

# No body comes near 18 digits of bytes; a longer count is taken as HUGE, not parsed: int()
# refuses a string of more than 4,300 digits (Python 3.11+), and a header may be padded with zeros.
HUGE = 10**18


def byte_count(text: str) -> int | None:
    """A header's byte count; None unless it is ASCII digits alone (int() also takes "+5",
    "5_000", " 5" and other scripts' digits, which a check of the text as digits would let past)."""
    if not (text.isascii() and text.isdigit()):
        return None
    digits = text.lstrip("0")
    return int(digits or "0") if len(digits) <= 18 else HUGE
