import unittest

from calendar_tools.core import day_of_year


class TestDayOfYear(unittest.TestCase):
    def test_1(self):
        self.assertEqual(day_of_year(2024, 3, 1), 61)

    def test_2(self):
        self.assertEqual(day_of_year(2023, 12, 31), 365)


if __name__ == "__main__":
    unittest.main()
