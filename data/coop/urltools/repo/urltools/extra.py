"""URL kinds."""


def is_absolute(url):
    """Whether the URL names a scheme."""
    return "://" in url
