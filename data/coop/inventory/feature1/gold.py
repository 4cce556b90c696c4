def low_stock(stock, threshold):
    """Sorted names of items with fewer than threshold left."""
    return sorted(k for k, v in stock.items() if v < threshold)
