import unittest

from calendar_tools.core import is_leap


class TestBase(unittest.TestCase):
    def test_1(self):
        self.assertTrue(is_leap(2000))


if __name__ == "__main__":
    unittest.main()
