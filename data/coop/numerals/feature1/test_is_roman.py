import unittest

from numerals.core import is_roman


class TestIsRoman(unittest.TestCase):
    def test_1(self):
        self.assertFalse(is_roman('IIII'))

    def test_2(self):
        self.assertFalse(is_roman(''))

    def test_3(self):
        self.assertFalse(is_roman('XA'))


if __name__ == "__main__":
    unittest.main()
