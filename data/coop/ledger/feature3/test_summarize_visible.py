import unittest

from ledger.extra import summarize


class TestSummarizeVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(summarize([5, -2]), (5, 2))


if __name__ == "__main__":
    unittest.main()
