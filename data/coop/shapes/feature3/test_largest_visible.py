import unittest

from shapes.extra import largest


class TestLargestVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(largest([('a', 1), ('b', 2)]), 'b')


if __name__ == "__main__":
    unittest.main()
