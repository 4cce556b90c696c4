import unittest

from shapes.core import circle_perimeter


class TestCirclePerimeter(unittest.TestCase):
    def test_1(self):
        self.assertEqual(circle_perimeter(0), 0)

    def test_2(self):
        self.assertRaises(ValueError, circle_perimeter, -1)


if __name__ == "__main__":
    unittest.main()
