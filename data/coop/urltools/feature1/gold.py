def add_param(url, key, value):
    """url with key=value appended to its query."""
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}{key}={value}"
