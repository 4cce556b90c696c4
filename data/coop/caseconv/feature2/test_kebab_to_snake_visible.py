import unittest

from caseconv.core import kebab_to_snake


class TestKebabToSnakeVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(kebab_to_snake('a-b'), 'a_b')


if __name__ == "__main__":
    unittest.main()
