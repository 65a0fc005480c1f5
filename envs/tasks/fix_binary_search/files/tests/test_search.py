from search import binary_search


def test_finds_every_element():
    items = [1, 3, 5, 7, 9, 11]
    for i, x in enumerate(items):
        assert binary_search(items, x) == i


def test_single_element():
    assert binary_search([4], 4) == 0


def test_missing():
    assert binary_search([1, 3, 5], 4) == -1
    assert binary_search([], 1) == -1
