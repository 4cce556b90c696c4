import unittest

from units.extra import convert_temperature


class TestConvertTemperatureVisible(unittest.TestCase):
    def test_1(self):
        self.assertAlmostEqual(convert_temperature(100, 'C', 'F'), 212)


if __name__ == "__main__":
    unittest.main()
