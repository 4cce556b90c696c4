import unittest

from ledger.core import transfer


class TestTransferVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(transfer(10, 0, 4), (6, 4))


if __name__ == "__main__":
    unittest.main()
