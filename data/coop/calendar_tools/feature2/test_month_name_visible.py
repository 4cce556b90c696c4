import unittest

from calendar_tools.core import month_name


class TestMonthNameVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(month_name(1), 'January')


if __name__ == "__main__":
    unittest.main()
