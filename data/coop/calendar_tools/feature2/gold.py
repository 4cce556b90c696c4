def month_name(month):
    """'January' for 1; ValueError outside 1-12."""
    names = ["January", "February", "March", "April", "May", "June", "July",
             "August", "September", "October", "November", "December"]
    if not 1 <= month <= 12:
        raise ValueError("month must be 1-12")
    return names[month - 1]
