import unittest

from units.core import miles_to_km


class TestMilesToKmVisible(unittest.TestCase):
    def test_1(self):
        self.assertAlmostEqual(miles_to_km(1), 1.609344)


if __name__ == "__main__":
    unittest.main()
