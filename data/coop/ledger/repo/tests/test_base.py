import unittest

from ledger.core import deposit


class TestBase(unittest.TestCase):
    def test_1(self):
        self.assertEqual(deposit(1, 2), 3)


if __name__ == "__main__":
    unittest.main()
