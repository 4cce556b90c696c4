import unittest

from caseconv.extra import truncate_words


class TestTruncateWords(unittest.TestCase):
    def test_1(self):
        self.assertEqual(truncate_words('a  b', 5), 'a b')

    def test_2(self):
        self.assertEqual(truncate_words('a b', 0), '...')


if __name__ == "__main__":
    unittest.main()
