def day_of_year(year, month, day):
    """1 for January 1st."""
    return sum(days_in_month(year, m) for m in range(1, month)) + day
