import unittest

from vectors.core import dot


class TestBase(unittest.TestCase):
    def test_1(self):
        self.assertEqual(dot((1, 2), (3, 4)), 11)


if __name__ == "__main__":
    unittest.main()
