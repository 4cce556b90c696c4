import unittest

from textstats.core import word_count


class TestBase(unittest.TestCase):
    def test_1(self):
        self.assertEqual(word_count('a b c'), 3)


if __name__ == "__main__":
    unittest.main()
