import unittest

from calendar_tools.extra import format_date


class TestFormatDate(unittest.TestCase):
    def test_1(self):
        self.assertEqual(format_date(2024, 3, 1, 'us'), '03/01/2024')

    def test_2(self):
        self.assertRaises(ValueError, format_date, 2024, 3, 1, 'eu')


if __name__ == "__main__":
    unittest.main()
