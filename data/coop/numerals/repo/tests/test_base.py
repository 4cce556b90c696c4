import unittest

from numerals.core import to_roman


class TestBase(unittest.TestCase):
    def test_1(self):
        self.assertEqual(to_roman(1994), 'MCMXCIV')


if __name__ == "__main__":
    unittest.main()
