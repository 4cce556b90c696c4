import unittest

from cart.core import apply_discount


class TestApplyDiscount(unittest.TestCase):
    def test_1(self):
        self.assertEqual(apply_discount(19.99, 15), 16.99)

    def test_2(self):
        self.assertRaises(ValueError, apply_discount, 10, 101)


if __name__ == "__main__":
    unittest.main()
