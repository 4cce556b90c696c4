import unittest

from textstats.core import char_frequency


class TestCharFrequencyVisible(unittest.TestCase):
    def test_1(self):
        self.assertEqual(char_frequency('aab'), {'a': 2, 'b': 1})


if __name__ == "__main__":
    unittest.main()
