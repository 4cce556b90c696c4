import unittest

from units.extra import convert_temperature


class TestConvertTemperature(unittest.TestCase):
    def test_1(self):
        self.assertAlmostEqual(convert_temperature(32, 'F', 'K'), 273.15)

    def test_2(self):
        self.assertRaises(ValueError, convert_temperature, 1, 'X', 'C')


if __name__ == "__main__":
    unittest.main()
