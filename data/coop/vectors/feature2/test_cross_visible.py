import unittest

from vectors.core import cross


class TestCrossVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(cross((1, 0, 0), (0, 1, 0)), (0, 0, 1))


if __name__ == "__main__":
    unittest.main()
