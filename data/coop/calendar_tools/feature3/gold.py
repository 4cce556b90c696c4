def format_date(year, month, day, style="iso"):
    """'iso': 2024-03-01, 'us': 03/01/2024; ValueError for other styles."""
    if style == "iso":
        return f"{year:04d}-{month:02d}-{day:02d}"
    if style == "us":
        return f"{month:02d}/{day:02d}/{year:04d}"
    raise ValueError("unknown style")
