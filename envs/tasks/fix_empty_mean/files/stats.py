"""Descriptive statistics for the dashboard."""


def mean(values):
    return sum(values) / len(values)


def summary(values):
    return {
        "n": len(values),
        "mean": mean(values),
        "max": max(values) if values else None,
    }
