import unittest

from textstats.extra import reading_time


class TestReadingTime(unittest.TestCase):
    def test_1(self):
        self.assertEqual(reading_time('word ' * 201), 2)

    def test_2(self):
        self.assertEqual(reading_time(''), 0)

    def test_3(self):
        self.assertEqual(reading_time('a b c', wpm=2), 2)


if __name__ == "__main__":
    unittest.main()
