import unittest

from units.core import c_to_k


class TestCToK(unittest.TestCase):
    def test_1(self):
        self.assertAlmostEqual(c_to_k(-273.15), 0.0)

    def test_2(self):
        self.assertRaises(ValueError, c_to_k, -300)


if __name__ == "__main__":
    unittest.main()
