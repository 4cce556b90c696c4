import unittest

from ledger.core import transfer


class TestTransfer(unittest.TestCase):
    def test_1(self):
        self.assertRaises(ValueError, transfer, 1, 0, 2)

    def test_2(self):
        self.assertRaises(ValueError, transfer, 5, 0, 0)


if __name__ == "__main__":
    unittest.main()
