from wordfreq import top_words, words


def test_simple():
    assert top_words("a b a c a b", 2) == ["a", "b"]


def test_case_insensitive():
    assert top_words("The the THE cat", 1) == ["the"]


def test_punctuation():
    assert words("Hi, there. hi!") == ["hi", "there", "hi"]
