import unittest

from shapes.core import circle_perimeter


class TestCirclePerimeterVisible(unittest.TestCase):
    def test_1(self):
        self.assertAlmostEqual(circle_perimeter(1), 6.283185307179586)


if __name__ == "__main__":
    unittest.main()
