import unittest

from gradebook.core import median


class TestMedianVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(median([3, 1, 2]), 2)


if __name__ == "__main__":
    unittest.main()
