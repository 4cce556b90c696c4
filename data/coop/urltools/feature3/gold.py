def hostname(url):
    """Lower-cased host without port, user or path."""
    rest = url.split("://", 1)[1]
    netloc = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    return netloc.rsplit("@", 1)[-1].split(":", 1)[0].lower()
