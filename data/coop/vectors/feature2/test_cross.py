import unittest

from vectors.core import cross


class TestCross(unittest.TestCase):
    def test_1(self):
        self.assertEqual(cross((2, 3, 4), (5, 6, 7)), (-3, 6, -3))

    def test_2(self):
        self.assertRaises(ValueError, cross, (1, 2), (3, 4))


if __name__ == "__main__":
    unittest.main()
