import unittest

from urltools.core import strip_fragment


class TestStripFragmentVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(strip_fragment('http://x#top'), 'http://x')


if __name__ == "__main__":
    unittest.main()
