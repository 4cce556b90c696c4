def strip_fragment(url):
    """url without its #fragment."""
    return url.split("#", 1)[0]
