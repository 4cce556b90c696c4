def cross(u, v):
    """Cross product of two 3-vectors; ValueError otherwise."""
    if len(u) != 3 or len(v) != 3:
        raise ValueError("cross product needs 3-vectors")
    return (u[1] * v[2] - u[2] * v[1], u[2] * v[0] - u[0] * v[2], u[0] * v[1] - u[1] * v[0])
