import unittest

from gradebook.extra import ranking


class TestRanking(unittest.TestCase):
    def test_1(self):
        self.assertEqual(ranking({'c': 5, 'a': 5, 'b': 9}), ['b', 'a', 'c'])

    def test_2(self):
        self.assertEqual(ranking({}), [])


if __name__ == "__main__":
    unittest.main()
