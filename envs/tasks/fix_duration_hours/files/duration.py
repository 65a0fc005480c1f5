"""Parse human durations like '1h30m' into seconds."""
import re

_UNITS = {"s": 1, "m": 60, "h": 60, "d": 86400}
_PART = re.compile(r"(\d+)([dhms])")


def parse_duration(text):
    text = text.strip().lower()
    if not text:
        raise ValueError("empty duration")
    parts = _PART.findall(text)
    if "".join(n + u for n, u in parts) != text:
        raise ValueError(f"bad duration: {text!r}")
    return sum(int(n) * _UNITS[u] for n, u in parts)
