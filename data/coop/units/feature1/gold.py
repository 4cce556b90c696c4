def c_to_k(c):
    """Celsius to Kelvin; ValueError below absolute zero."""
    if c < -273.15:
        raise ValueError("below absolute zero")
    return c + 273.15
