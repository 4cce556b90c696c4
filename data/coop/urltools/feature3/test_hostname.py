import unittest

from urltools.extra import hostname


class TestHostname(unittest.TestCase):
    def test_1(self):
        self.assertEqual(hostname('http://User@Example.COM:80/a'), 'example.com')

    def test_2(self):
        self.assertEqual(hostname('https://a.b?q=1'), 'a.b')


if __name__ == "__main__":
    unittest.main()
