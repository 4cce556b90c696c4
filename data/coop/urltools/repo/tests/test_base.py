import unittest

from urltools.core import join_query


class TestBase(unittest.TestCase):
    def test_1(self):
        self.assertEqual(join_query({'b': 2, 'a': 1}), 'a=1&b=2')


if __name__ == "__main__":
    unittest.main()
