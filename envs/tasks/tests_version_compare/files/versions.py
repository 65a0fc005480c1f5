"""Compare dotted version strings."""


def parse_version(text):
    return tuple(text.strip().split("."))


def is_newer(a, b):
    return parse_version(a) > parse_version(b)


def latest(versions):
    return max(versions, key=parse_version)
