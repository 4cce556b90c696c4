def sales_tax(amount, rate):
    """Tax at rate, rounded to cents; ValueError for a negative rate."""
    if rate < 0:
        raise ValueError("negative rate")
    return round(amount * rate, 2)
