import unittest

from inventory.core import merge_stock


class TestMergeStock(unittest.TestCase):
    def test_1(self):
        a = {'a': 1}
        self.assertEqual(merge_stock(a, {'b': 2}), {'a': 1, 'b': 2})
        self.assertEqual(a, {'a': 1})

    def test_2(self):
        self.assertEqual(merge_stock({}, {}), {})


if __name__ == "__main__":
    unittest.main()
