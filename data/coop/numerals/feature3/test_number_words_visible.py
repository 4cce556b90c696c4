import unittest

from numerals.extra import number_words


class TestNumberWordsVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(number_words(7), 'seven')


if __name__ == "__main__":
    unittest.main()
