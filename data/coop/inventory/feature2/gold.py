def merge_stock(a, b):
    """Both stocks' quantities added up per item."""
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out
