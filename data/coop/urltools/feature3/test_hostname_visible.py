import unittest

from urltools.extra import hostname


class TestHostnameVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(hostname('http://example.com/a'), 'example.com')


if __name__ == "__main__":
    unittest.main()
