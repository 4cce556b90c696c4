import unittest

from numerals.extra import number_words


class TestNumberWords(unittest.TestCase):
    def test_1(self):
        self.assertEqual(number_words(42), 'forty-two')

    def test_2(self):
        self.assertEqual(number_words(90), 'ninety')

    def test_3(self):
        self.assertRaises(ValueError, number_words, 100)


if __name__ == "__main__":
    unittest.main()
