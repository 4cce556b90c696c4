import unittest

from ledger.extra import summarize


class TestSummarize(unittest.TestCase):
    def test_1(self):
        self.assertEqual(summarize([]), (0, 0))

    def test_2(self):
        self.assertEqual(summarize([1, 2, -3, -4]), (3, 7))


if __name__ == "__main__":
    unittest.main()
