import unittest

from gradebook.core import median


class TestMedian(unittest.TestCase):
    def test_1(self):
        self.assertEqual(median([4, 1, 3, 2]), 2.5)

    def test_2(self):
        self.assertRaises(ValueError, median, [])


if __name__ == "__main__":
    unittest.main()
