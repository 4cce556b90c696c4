def compound_interest(balance, rate, years):
    """Balance after yearly compounding, rounded to cents."""
    return round(balance * (1 + rate) ** years, 2)
