import unittest

from gradebook.core import letter


class TestBase(unittest.TestCase):
    def test_1(self):
        self.assertEqual(letter(85), 'B')


if __name__ == "__main__":
    unittest.main()
