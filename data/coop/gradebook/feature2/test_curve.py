import unittest

from gradebook.core import curve


class TestCurve(unittest.TestCase):
    def test_1(self):
        self.assertEqual(curve([90, 100], 100), [95, 100])

    def test_2(self):
        self.assertEqual(curve([80], 80), [80])


if __name__ == "__main__":
    unittest.main()
