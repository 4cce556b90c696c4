import unittest

from urltools.core import strip_fragment


class TestStripFragment(unittest.TestCase):
    def test_1(self):
        self.assertEqual(strip_fragment('http://x?a=1#b#c'), 'http://x?a=1')

    def test_2(self):
        self.assertEqual(strip_fragment('http://x'), 'http://x')


if __name__ == "__main__":
    unittest.main()
