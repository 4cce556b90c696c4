import unittest

from caseconv.core import kebab_to_snake


class TestKebabToSnake(unittest.TestCase):
    def test_1(self):
        self.assertEqual(kebab_to_snake('My-Var-Name'), 'my_var_name')

    def test_2(self):
        self.assertEqual(kebab_to_snake('x'), 'x')


if __name__ == "__main__":
    unittest.main()
