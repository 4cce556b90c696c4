import unittest

from inventory.core import merge_stock


class TestMergeStockVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(merge_stock({'a': 1}, {'a': 2}), {'a': 3})


if __name__ == "__main__":
    unittest.main()
