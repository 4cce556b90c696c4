import unittest

from cart.core import apply_discount


class TestApplyDiscountVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(apply_discount(100, 10), 90)


if __name__ == "__main__":
    unittest.main()
