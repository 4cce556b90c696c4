import unittest

from vectors.core import subtract


class TestSubtractVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(subtract((3, 3), (1, 2)), (2, 1))


if __name__ == "__main__":
    unittest.main()
