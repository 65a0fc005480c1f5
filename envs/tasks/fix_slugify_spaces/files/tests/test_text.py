from text import slugify


def test_basic():
    assert slugify("Hello, World!") == "hello-world"


def test_extra_spaces():
    assert slugify("  many   spaces here ") == "many-spaces-here"


def test_existing_dashes():
    assert slugify("already-a - slug") == "already-a-slug"
