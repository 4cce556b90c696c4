import unittest

from shapes.core import triangle_area


class TestTriangleAreaVisible(unittest.TestCase):
    def test_1(self):
        self.assertAlmostEqual(triangle_area(3, 4, 5), 6)


if __name__ == "__main__":
    unittest.main()
