import unittest

from cart.core import sales_tax


class TestSalesTax(unittest.TestCase):
    def test_1(self):
        self.assertEqual(sales_tax(9.99, 0.075), 0.75)

    def test_2(self):
        self.assertRaises(ValueError, sales_tax, 1, -0.1)


if __name__ == "__main__":
    unittest.main()
