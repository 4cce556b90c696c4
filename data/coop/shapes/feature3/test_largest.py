import unittest

from shapes.extra import largest


class TestLargest(unittest.TestCase):
    def test_1(self):
        self.assertEqual(largest([('a', 2), ('b', 2)]), 'a')

    def test_2(self):
        self.assertIsNone(largest([]))


if __name__ == "__main__":
    unittest.main()
