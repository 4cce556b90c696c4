import unittest

from caseconv.core import snake_to_pascal


class TestSnakeToPascal(unittest.TestCase):
    def test_1(self):
        self.assertEqual(snake_to_pascal('a'), 'A')

    def test_2(self):
        self.assertEqual(snake_to_pascal('http_server_v2'), 'HttpServerV2')


if __name__ == "__main__":
    unittest.main()
