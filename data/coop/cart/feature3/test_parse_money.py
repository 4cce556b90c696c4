import unittest

from cart.extra import parse_money


class TestParseMoney(unittest.TestCase):
    def test_1(self):
        self.assertEqual(parse_money('$1,234.50'), 123450)

    def test_2(self):
        self.assertEqual(parse_money('3'), 300)

    def test_3(self):
        self.assertEqual(parse_money('0.5'), 50)


if __name__ == "__main__":
    unittest.main()
