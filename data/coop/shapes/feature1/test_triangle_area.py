import unittest

from shapes.core import triangle_area


class TestTriangleArea(unittest.TestCase):
    def test_1(self):
        self.assertAlmostEqual(triangle_area(2, 2, 2), 1.7320508075688772)

    def test_2(self):
        self.assertRaises(ValueError, triangle_area, 1, 1, 3)


if __name__ == "__main__":
    unittest.main()
