"""The token estimate: one token per four bytes of UTF-8, rounded up.

Bytes, not characters: a CJK character costs three bytes and an emoji four, so counting characters
would under-report those scripts three to four times. The estimate is zero only for the empty
string, so no number of short items can pass a budget that never binds.
"""

from __future__ import annotations


def estimate_tokens(text: str) -> int:
    # str.isascii() is O(1) in CPython; an ASCII string has one byte per character.
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    return -(-size // 4)
