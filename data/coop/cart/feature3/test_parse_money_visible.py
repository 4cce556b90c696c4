import unittest

from cart.extra import parse_money


class TestParseMoneyVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(parse_money('$1.50'), 150)


if __name__ == "__main__":
    unittest.main()
