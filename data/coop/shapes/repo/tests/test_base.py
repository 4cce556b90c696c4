import unittest

from shapes.core import rect_area


class TestBase(unittest.TestCase):
    def test_1(self):
        self.assertEqual(rect_area(2, 3), 6)


if __name__ == "__main__":
    unittest.main()
