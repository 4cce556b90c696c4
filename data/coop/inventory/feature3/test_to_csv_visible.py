import unittest

from inventory.extra import to_csv


class TestToCsvVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(to_csv({'a': 1}), 'name,qty\na,1\n')


if __name__ == "__main__":
    unittest.main()
