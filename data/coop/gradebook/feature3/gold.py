def ranking(results):
    """Names by score, highest first, ties alphabetically."""
    return sorted(results, key=lambda name: (-results[name], name))
