import unittest

from units.core import c_to_k


class TestCToKVisible(unittest.TestCase):
    def test_1(self):
        self.assertAlmostEqual(c_to_k(0), 273.15)


if __name__ == "__main__":
    unittest.main()
