import unittest

from vectors.extra import normalize


class TestNormalize(unittest.TestCase):
    def test_1(self):
        self.assertEqual(normalize((0, 5)), (0.0, 1.0))

    def test_2(self):
        self.assertRaises(ValueError, normalize, (0, 0))


if __name__ == "__main__":
    unittest.main()
