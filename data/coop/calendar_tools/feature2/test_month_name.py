import unittest

from calendar_tools.core import month_name


class TestMonthName(unittest.TestCase):
    def test_1(self):
        self.assertEqual(month_name(12), 'December')

    def test_2(self):
        self.assertRaises(ValueError, month_name, 0)


if __name__ == "__main__":
    unittest.main()
