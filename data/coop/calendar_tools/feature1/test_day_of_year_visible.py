import unittest

from calendar_tools.core import day_of_year


class TestDayOfYearVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(day_of_year(2023, 1, 1), 1)


if __name__ == "__main__":
    unittest.main()
