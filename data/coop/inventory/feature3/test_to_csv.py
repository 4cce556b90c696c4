import unittest

from inventory.extra import to_csv


class TestToCsv(unittest.TestCase):
    def test_1(self):
        self.assertEqual(to_csv({'b': 2, 'a': 1}), 'name,qty\na,1\nb,2\n')

    def test_2(self):
        self.assertEqual(to_csv({}), 'name,qty\n')


if __name__ == "__main__":
    unittest.main()
