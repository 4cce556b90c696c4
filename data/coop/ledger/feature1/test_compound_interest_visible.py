import unittest

from ledger.core import compound_interest


class TestCompoundInterestVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(compound_interest(100, 0.1, 1), 110)


if __name__ == "__main__":
    unittest.main()
