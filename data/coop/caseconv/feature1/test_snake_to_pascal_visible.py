import unittest

from caseconv.core import snake_to_pascal


class TestSnakeToPascalVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(snake_to_pascal('my_var'), 'MyVar')


if __name__ == "__main__":
    unittest.main()
