import unittest

from cart.core import sales_tax


class TestSalesTaxVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(sales_tax(100, 0.2), 20)


if __name__ == "__main__":
    unittest.main()
