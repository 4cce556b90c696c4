import unittest

from inventory.core import low_stock


class TestLowStock(unittest.TestCase):
    def test_1(self):
        self.assertEqual(low_stock({'z': 0, 'a': 2, 'm': 9}, 3), ['a', 'z'])

    def test_2(self):
        self.assertEqual(low_stock({'a': 3}, 3), [])


if __name__ == "__main__":
    unittest.main()
