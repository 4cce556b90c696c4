import unittest

from textstats.core import longest_word


class TestLongestWordVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(longest_word('a bbb cc'), 'bbb')


if __name__ == "__main__":
    unittest.main()
