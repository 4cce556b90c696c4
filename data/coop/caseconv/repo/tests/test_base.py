import unittest

from caseconv.core import snake_to_camel


class TestBase(unittest.TestCase):
    def test_1(self):
        self.assertEqual(snake_to_camel('a_b'), 'aB')


if __name__ == "__main__":
    unittest.main()
