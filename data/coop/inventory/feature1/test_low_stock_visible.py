import unittest

from inventory.core import low_stock


class TestLowStockVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(low_stock({'a': 1, 'b': 5}, 3), ['a'])


if __name__ == "__main__":
    unittest.main()
