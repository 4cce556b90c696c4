import unittest

from units.core import miles_to_km


class TestMilesToKm(unittest.TestCase):
    def test_1(self):
        self.assertAlmostEqual(miles_to_km(10), 16.09344)

    def test_2(self):
        self.assertEqual(miles_to_km(0), 0)


if __name__ == "__main__":
    unittest.main()
