"""Word frequencies for the search index."""
from collections import Counter


def words(text):
    return text.split()


def top_words(text, n=3):
    counts = Counter(words(text))
    return [word for word, _ in counts.most_common(n)]
