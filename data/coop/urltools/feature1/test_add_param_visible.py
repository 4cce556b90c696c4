import unittest

from urltools.core import add_param


class TestAddParamVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(add_param('http://x', 'a', 1), 'http://x?a=1')


if __name__ == "__main__":
    unittest.main()
