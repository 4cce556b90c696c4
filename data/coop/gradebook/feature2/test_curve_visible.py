import unittest

from gradebook.core import curve


class TestCurveVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(curve([50, 70], 70), [60, 80])


if __name__ == "__main__":
    unittest.main()
