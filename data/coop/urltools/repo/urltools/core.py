"""Query strings."""


def split_query(query):
    """'a=1&b=2' -> {'a': '1', 'b': '2'}."""
    return dict(part.split("=", 1) for part in query.split("&") if part)


def join_query(params):
    """{'a': '1'} -> 'a=1', keys sorted."""
    return "&".join(f"{k}={v}" for k, v in sorted(params.items()))


def has_query(url):
    """Whether the URL has a query string."""
    return "?" in url
