import unittest

from ledger.core import compound_interest


class TestCompoundInterest(unittest.TestCase):
    def test_1(self):
        self.assertEqual(compound_interest(100, 0.1, 2), 121)

    def test_2(self):
        self.assertEqual(compound_interest(50, 0.05, 0), 50)


if __name__ == "__main__":
    unittest.main()
