import unittest

from numerals.core import roman_add


class TestRomanAdd(unittest.TestCase):
    def test_1(self):
        self.assertEqual(roman_add('IX', 'III'), 'XII')

    def test_2(self):
        self.assertEqual(roman_add('MCM', 'XCIV'), 'MCMXCIV')


if __name__ == "__main__":
    unittest.main()
