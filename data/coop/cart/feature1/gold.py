def apply_discount(amount, percent):
    """amount less percent %, rounded to cents; ValueError outside 0-100."""
    if not 0 <= percent <= 100:
        raise ValueError("percent must be between 0 and 100")
    return round(amount * (100 - percent) / 100, 2)
