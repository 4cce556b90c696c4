def miles_to_km(miles):
    """Miles to kilometres."""
    return miles * 1.609344
