import unittest

from numerals.core import roman_add


class TestRomanAddVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(roman_add('I', 'I'), 'II')


if __name__ == "__main__":
    unittest.main()
