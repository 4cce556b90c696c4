import unittest

from calendar_tools.extra import format_date


class TestFormatDateVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(format_date(2024, 3, 1), '2024-03-01')


if __name__ == "__main__":
    unittest.main()
