import unittest

from numerals.core import is_roman


class TestIsRomanVisible(unittest.TestCase):
    def test_1(self):
        self.assertTrue(is_roman('XIV'))


if __name__ == "__main__":
    unittest.main()
