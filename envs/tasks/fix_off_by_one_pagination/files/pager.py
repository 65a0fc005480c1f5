"""Split a list into pages."""


def paginate(items, page, per_page=10):
    """Return the items on 1-based `page`."""
    if page < 1:
        raise ValueError("page must be >= 1")
    start = (page - 1) * per_page
    end = start + per_page - 1
    return items[start:end]


def page_count(items, per_page=10):
    return (len(items) + per_page - 1) // per_page
