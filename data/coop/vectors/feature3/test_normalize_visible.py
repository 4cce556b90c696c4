import unittest

from vectors.extra import normalize


class TestNormalizeVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(normalize((3, 4)), (0.6, 0.8))


if __name__ == "__main__":
    unittest.main()
