"""Text helpers for URLs."""
import re


def slugify(title):
    """'Hello, World!' -> 'hello-world'"""
    title = title.lower()
    title = re.sub(r"[^a-z0-9\s-]", "", title)
    return title.replace(" ", "-")
