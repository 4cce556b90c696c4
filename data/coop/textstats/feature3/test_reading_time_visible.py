import unittest

from textstats.extra import reading_time


class TestReadingTimeVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(reading_time('word ' * 200), 1)


if __name__ == "__main__":
    unittest.main()
