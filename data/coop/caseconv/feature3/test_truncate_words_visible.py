import unittest

from caseconv.extra import truncate_words


class TestTruncateWordsVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(truncate_words('a b c', 2), 'a b...')


if __name__ == "__main__":
    unittest.main()
