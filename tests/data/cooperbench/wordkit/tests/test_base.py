import unittest

from wordkit.core import first_word, normalize_spaces, word_count


class TestBase(unittest.TestCase):
    def test_word_count(self):
        self.assertEqual(word_count("a b  c"), 3)

    def test_normalize_spaces(self):
        self.assertEqual(normalize_spaces("  a \t b "), "a b")

    def test_first_word(self):
        self.assertEqual(first_word(""), "")
