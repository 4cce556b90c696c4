import unittest

from textstats.core import char_frequency


class TestCharFrequency(unittest.TestCase):
    def test_1(self):
        self.assertEqual(char_frequency('Aa b!'), {'a': 2, 'b': 1})

    def test_2(self):
        self.assertEqual(char_frequency(''), {})


if __name__ == "__main__":
    unittest.main()
