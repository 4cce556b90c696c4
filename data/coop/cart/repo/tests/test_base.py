import unittest

from cart.core import subtotal


class TestBase(unittest.TestCase):
    def test_1(self):
        self.assertEqual(subtotal([(2, 3), (1, 1)]), 7)


if __name__ == "__main__":
    unittest.main()
