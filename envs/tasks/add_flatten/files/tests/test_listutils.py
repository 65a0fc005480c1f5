import listutils


def test_chunk():
    assert listutils.chunk([1, 2, 3], 2) == [[1, 2], [3]]


def test_flatten():
    assert listutils.flatten([1, [2, [3, (4, 5)]], [], 6]) == [1, 2, 3, 4, 5, 6]


def test_flatten_keeps_strings():
    assert listutils.flatten(["ab", ["cd"]]) == ["ab", "cd"]
