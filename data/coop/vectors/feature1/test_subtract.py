import unittest

from vectors.core import subtract


class TestSubtract(unittest.TestCase):
    def test_1(self):
        self.assertEqual(subtract((), ()), ())

    def test_2(self):
        self.assertRaises(ValueError, subtract, (1,), (1, 2))


if __name__ == "__main__":
    unittest.main()
