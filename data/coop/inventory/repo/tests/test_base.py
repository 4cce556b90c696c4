import unittest

from inventory.core import total_items


class TestBase(unittest.TestCase):
    def test_1(self):
        self.assertEqual(total_items({'a': 2, 'b': 3}), 5)


if __name__ == "__main__":
    unittest.main()
