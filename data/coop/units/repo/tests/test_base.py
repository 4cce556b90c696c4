import unittest

from units.core import c_to_f


class TestBase(unittest.TestCase):
    def test_1(self):
        self.assertEqual(c_to_f(100), 212)


if __name__ == "__main__":
    unittest.main()
