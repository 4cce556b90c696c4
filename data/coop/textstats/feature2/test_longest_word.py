import unittest

from textstats.core import longest_word


class TestLongestWord(unittest.TestCase):
    def test_1(self):
        self.assertEqual(longest_word('ab cd'), 'ab')

    def test_2(self):
        self.assertEqual(longest_word('   '), '')


if __name__ == "__main__":
    unittest.main()
