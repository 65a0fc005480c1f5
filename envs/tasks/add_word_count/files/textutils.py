"""String helpers."""
import re


def normalize_space(text):
    """Collapse runs of whitespace into single spaces."""
    return re.sub(r"\s+", " ", text).strip()
