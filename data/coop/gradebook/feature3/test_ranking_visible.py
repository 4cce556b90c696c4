import unittest

from gradebook.extra import ranking


class TestRankingVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(ranking({'a': 1, 'b': 2}), ['b', 'a'])


if __name__ == "__main__":
    unittest.main()
