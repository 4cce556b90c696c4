"""The cooperative-coding tasks' content: 12 small Python repositories, 3 features each.

Read by scripts/generate_coop_tasks.py, which turns it into CooperBench's layout. Per repository:
the package's base files; per feature: the module it edits, the existing function its gold code is
inserted after (``anchor``), the new code, the request in prose, and visible and hidden tests.

Features 1 and 2 of every repository edit the same module (at different places in the gold
patches, so gold pairs merge cleanly); feature 3 edits another module. A ``naive`` patch appends its
code at the end of the module, as a coder who ignores the partner would: the naive patches of
features 1 and 2 then conflict under a plain ``git merge``, the other pairs do not.
"""

from __future__ import annotations

REPOS: list[dict] = [
    {
        "name": "textstats",
        "split": "train",
        "files": {
            "textstats/core.py": '''
                """Counting words and sentences."""

                import re


                def word_count(text):
                    """Number of whitespace-separated words."""
                    return len(text.split())


                def sentence_count(text):
                    """Number of sentences ending in '.', '!' or '?'."""
                    return len(re.findall(r"[.!?]+", text))


                def average_word_length(text):
                    """Mean length of the words, 0.0 for no words."""
                    words = text.split()
                    return sum(len(w) for w in words) / len(words) if words else 0.0
            ''',
            "textstats/extra.py": '''
                """Word rankings."""

                from collections import Counter


                def top_words(text, n=3):
                    """The n most common lower-cased words."""
                    return [w for w, _ in Counter(text.lower().split()).most_common(n)]
            ''',
        },
        "base_test": ("from textstats.core import word_count", "self.assertEqual(word_count('a b c'), 3)"),
        "features": [
            {
                "slug": "char_frequency",
                "module": "textstats/core.py",
                "anchor": "word_count",
                "md": "Add `char_frequency(text)` to `textstats/core.py`: a dict mapping each letter (lower-cased) to how often it occurs; characters that are not letters are ignored.",
                "code": '''
                    def char_frequency(text):
                        """How often each letter occurs, case-insensitive."""
                        counts = {}
                        for ch in text.lower():
                            if ch.isalpha():
                                counts[ch] = counts.get(ch, 0) + 1
                        return counts
                ''',
                "imports": "from textstats.core import char_frequency",
                "visible": ["self.assertEqual(char_frequency('aab'), {'a': 2, 'b': 1})"],
                "hidden": ["self.assertEqual(char_frequency('Aa b!'), {'a': 2, 'b': 1})", "self.assertEqual(char_frequency(''), {})"],
            },
            {
                "slug": "longest_word",
                "module": "textstats/core.py",
                "anchor": "average_word_length",
                "md": "Add `longest_word(text)` to `textstats/core.py`: the longest word (the first one on ties), or an empty string when the text has no words.",
                "code": '''
                    def longest_word(text):
                        """The longest word, the first on ties; '' for no words."""
                        best = ""
                        for w in text.split():
                            if len(w) > len(best):
                                best = w
                        return best
                ''',
                "imports": "from textstats.core import longest_word",
                "visible": ["self.assertEqual(longest_word('a bbb cc'), 'bbb')"],
                "hidden": ["self.assertEqual(longest_word('ab cd'), 'ab')", "self.assertEqual(longest_word('   '), '')"],
            },
            {
                "slug": "reading_time",
                "module": "textstats/extra.py",
                "anchor": "top_words",
                "md": "Add `reading_time(text, wpm=200)` to `textstats/extra.py`: whole minutes needed to read the text at `wpm` words per minute, rounded up; 0 for a text without words.",
                "code": '''
                    def reading_time(text, wpm=200):
                        """Minutes to read the text, rounded up; 0 for no words."""
                        words = len(text.split())
                        return -(-words // wpm)
                ''',
                "imports": "from textstats.extra import reading_time",
                "visible": ["self.assertEqual(reading_time('word ' * 200), 1)"],
                "hidden": [
                    "self.assertEqual(reading_time('word ' * 201), 2)",
                    "self.assertEqual(reading_time(''), 0)",
                    "self.assertEqual(reading_time('a b c', wpm=2), 2)",
                ],
            },
        ],
    },
    {
        "name": "inventory",
        "split": "train",
        "files": {
            "inventory/core.py": '''
                """Stock kept as a dict of item name -> quantity."""


                def add_item(stock, name, qty):
                    """A new stock with qty more of name."""
                    out = dict(stock)
                    out[name] = out.get(name, 0) + qty
                    return out


                def remove_item(stock, name, qty):
                    """A new stock with qty fewer of name; ValueError when there are not enough."""
                    if stock.get(name, 0) < qty:
                        raise ValueError(f"not enough {name}")
                    out = dict(stock)
                    out[name] -= qty
                    return out


                def total_items(stock):
                    """All quantities added up."""
                    return sum(stock.values())
            ''',
            "inventory/extra.py": '''
                """Reports on a stock."""


                def format_report(stock):
                    """One 'name: qty' line per item, sorted by name."""
                    return "\\n".join(f"{k}: {v}" for k, v in sorted(stock.items()))
            ''',
        },
        "base_test": ("from inventory.core import total_items", "self.assertEqual(total_items({'a': 2, 'b': 3}), 5)"),
        "features": [
            {
                "slug": "low_stock",
                "module": "inventory/core.py",
                "anchor": "add_item",
                "md": "Add `low_stock(stock, threshold)` to `inventory/core.py`: the sorted names of items whose quantity is below `threshold`.",
                "code": '''
                    def low_stock(stock, threshold):
                        """Sorted names of items with fewer than threshold left."""
                        return sorted(k for k, v in stock.items() if v < threshold)
                ''',
                "imports": "from inventory.core import low_stock",
                "visible": ["self.assertEqual(low_stock({'a': 1, 'b': 5}, 3), ['a'])"],
                "hidden": [
                    "self.assertEqual(low_stock({'z': 0, 'a': 2, 'm': 9}, 3), ['a', 'z'])",
                    "self.assertEqual(low_stock({'a': 3}, 3), [])",
                ],
            },
            {
                "slug": "merge_stock",
                "module": "inventory/core.py",
                "anchor": "total_items",
                "md": "Add `merge_stock(a, b)` to `inventory/core.py`: a new stock holding the quantities of both stocks added up per item; the inputs are left unchanged.",
                "code": '''
                    def merge_stock(a, b):
                        """Both stocks' quantities added up per item."""
                        out = dict(a)
                        for k, v in b.items():
                            out[k] = out.get(k, 0) + v
                        return out
                ''',
                "imports": "from inventory.core import merge_stock",
                "visible": ["self.assertEqual(merge_stock({'a': 1}, {'a': 2}), {'a': 3})"],
                "hidden": [
                    "a = {'a': 1}\n        self.assertEqual(merge_stock(a, {'b': 2}), {'a': 1, 'b': 2})\n        self.assertEqual(a, {'a': 1})",
                    "self.assertEqual(merge_stock({}, {}), {})",
                ],
            },
            {
                "slug": "to_csv",
                "module": "inventory/extra.py",
                "anchor": "format_report",
                "md": "Add `to_csv(stock)` to `inventory/extra.py`: CSV text with the header line `name,qty` and then one `name,qty` line per item sorted by name, each line ending in a newline.",
                "code": '''
                    def to_csv(stock):
                        """CSV with a name,qty header, rows sorted by name."""
                        lines = ["name,qty"] + [f"{k},{v}" for k, v in sorted(stock.items())]
                        return "".join(line + "\\n" for line in lines)
                ''',
                "imports": "from inventory.extra import to_csv",
                "visible": ["self.assertEqual(to_csv({'a': 1}), 'name,qty\\na,1\\n')"],
                "hidden": [
                    "self.assertEqual(to_csv({'b': 2, 'a': 1}), 'name,qty\\na,1\\nb,2\\n')",
                    "self.assertEqual(to_csv({}), 'name,qty\\n')",
                ],
            },
        ],
    },
    {
        "name": "units",
        "split": "train",
        "files": {
            "units/core.py": '''
                """Unit conversions."""


                def c_to_f(c):
                    """Celsius to Fahrenheit."""
                    return c * 9 / 5 + 32


                def f_to_c(f):
                    """Fahrenheit to Celsius."""
                    return (f - 32) * 5 / 9


                def km_to_miles(km):
                    """Kilometres to miles."""
                    return km / 1.609344
            ''',
            "units/extra.py": '''
                """Reading quantities written as text."""


                def parse_quantity(text):
                    """'12 km' -> (12.0, 'km')."""
                    number, unit = text.split()
                    return float(number), unit
            ''',
        },
        "base_test": ("from units.core import c_to_f", "self.assertEqual(c_to_f(100), 212)"),
        "features": [
            {
                "slug": "c_to_k",
                "module": "units/core.py",
                "anchor": "c_to_f",
                "md": "Add `c_to_k(c)` to `units/core.py`: Celsius to Kelvin (add 273.15); raise `ValueError` for temperatures below absolute zero (-273.15 C).",
                "code": '''
                    def c_to_k(c):
                        """Celsius to Kelvin; ValueError below absolute zero."""
                        if c < -273.15:
                            raise ValueError("below absolute zero")
                        return c + 273.15
                ''',
                "imports": "from units.core import c_to_k",
                "visible": ["self.assertAlmostEqual(c_to_k(0), 273.15)"],
                "hidden": ["self.assertAlmostEqual(c_to_k(-273.15), 0.0)", "self.assertRaises(ValueError, c_to_k, -300)"],
            },
            {
                "slug": "miles_to_km",
                "module": "units/core.py",
                "anchor": "km_to_miles",
                "md": "Add `miles_to_km(miles)` to `units/core.py`: miles to kilometres (one mile is 1.609344 km).",
                "code": '''
                    def miles_to_km(miles):
                        """Miles to kilometres."""
                        return miles * 1.609344
                ''',
                "imports": "from units.core import miles_to_km",
                "visible": ["self.assertAlmostEqual(miles_to_km(1), 1.609344)"],
                "hidden": ["self.assertAlmostEqual(miles_to_km(10), 16.09344)", "self.assertEqual(miles_to_km(0), 0)"],
            },
            {
                "slug": "convert_temperature",
                "module": "units/extra.py",
                "anchor": "parse_quantity",
                "md": "Add `convert_temperature(value, source, target)` to `units/extra.py`: converts between the units 'C', 'F' and 'K'; raise `ValueError` for any other unit name.",
                "code": '''
                    def convert_temperature(value, source, target):
                        """Between 'C', 'F' and 'K'; ValueError for other units."""
                        to_c = {"C": lambda v: v, "F": lambda v: (v - 32) * 5 / 9, "K": lambda v: v - 273.15}
                        from_c = {"C": lambda v: v, "F": lambda v: v * 9 / 5 + 32, "K": lambda v: v + 273.15}
                        if source not in to_c or target not in from_c:
                            raise ValueError("unknown unit")
                        return from_c[target](to_c[source](value))
                ''',
                "imports": "from units.extra import convert_temperature",
                "visible": ["self.assertAlmostEqual(convert_temperature(100, 'C', 'F'), 212)"],
                "hidden": [
                    "self.assertAlmostEqual(convert_temperature(32, 'F', 'K'), 273.15)",
                    "self.assertRaises(ValueError, convert_temperature, 1, 'X', 'C')",
                ],
            },
        ],
    },
    {
        "name": "cart",
        "split": "train",
        "files": {
            "cart/core.py": '''
                """Prices of a shopping cart."""


                def line_total(price, qty):
                    """Price times quantity."""
                    return price * qty


                def subtotal(items):
                    """Sum of line totals of (price, qty) pairs."""
                    return sum(line_total(p, q) for p, q in items)


                def item_count(items):
                    """Number of units in the cart."""
                    return sum(q for _, q in items)
            ''',
            "cart/extra.py": '''
                """Money as text."""


                def format_money(cents):
                    """1234 -> '$12.34'."""
                    return f"${cents // 100}.{cents % 100:02d}"
            ''',
        },
        "base_test": ("from cart.core import subtotal", "self.assertEqual(subtotal([(2, 3), (1, 1)]), 7)"),
        "features": [
            {
                "slug": "apply_discount",
                "module": "cart/core.py",
                "anchor": "line_total",
                "md": "Add `apply_discount(amount, percent)` to `cart/core.py`: the amount reduced by `percent` percent, rounded to 2 decimals; raise `ValueError` when percent is not between 0 and 100.",
                "code": '''
                    def apply_discount(amount, percent):
                        """amount less percent %, rounded to cents; ValueError outside 0-100."""
                        if not 0 <= percent <= 100:
                            raise ValueError("percent must be between 0 and 100")
                        return round(amount * (100 - percent) / 100, 2)
                ''',
                "imports": "from cart.core import apply_discount",
                "visible": ["self.assertEqual(apply_discount(100, 10), 90)"],
                "hidden": ["self.assertEqual(apply_discount(19.99, 15), 16.99)", "self.assertRaises(ValueError, apply_discount, 10, 101)"],
            },
            {
                "slug": "sales_tax",
                "module": "cart/core.py",
                "anchor": "item_count",
                "md": "Add `sales_tax(amount, rate)` to `cart/core.py`: the tax on `amount` at `rate` (0.2 means 20%), rounded to 2 decimals; raise `ValueError` for a negative rate.",
                "code": '''
                    def sales_tax(amount, rate):
                        """Tax at rate, rounded to cents; ValueError for a negative rate."""
                        if rate < 0:
                            raise ValueError("negative rate")
                        return round(amount * rate, 2)
                ''',
                "imports": "from cart.core import sales_tax",
                "visible": ["self.assertEqual(sales_tax(100, 0.2), 20)"],
                "hidden": ["self.assertEqual(sales_tax(9.99, 0.075), 0.75)", "self.assertRaises(ValueError, sales_tax, 1, -0.1)"],
            },
            {
                "slug": "parse_money",
                "module": "cart/extra.py",
                "anchor": "format_money",
                "md": "Add `parse_money(text)` to `cart/extra.py`: reads text like '$1,234.50' or '3' and returns whole cents as an int (123450, 300).",
                "code": '''
                    def parse_money(text):
                        """'$1,234.50' -> 123450 cents."""
                        clean = text.strip().lstrip("$").replace(",", "")
                        dollars, _, cents = clean.partition(".")
                        return int(dollars or 0) * 100 + int((cents + "00")[:2])
                ''',
                "imports": "from cart.extra import parse_money",
                "visible": ["self.assertEqual(parse_money('$1.50'), 150)"],
                "hidden": [
                    "self.assertEqual(parse_money('$1,234.50'), 123450)",
                    "self.assertEqual(parse_money('3'), 300)",
                    "self.assertEqual(parse_money('0.5'), 50)",
                ],
            },
        ],
    },
    {
        "name": "vectors",
        "split": "train",
        "files": {
            "vectors/core.py": '''
                """Vectors as tuples of numbers."""


                def add(u, v):
                    """Element-wise sum."""
                    return tuple(a + b for a, b in zip(u, v))


                def dot(u, v):
                    """Dot product."""
                    return sum(a * b for a, b in zip(u, v))


                def scale(u, k):
                    """Every element times k."""
                    return tuple(a * k for a in u)
            ''',
            "vectors/extra.py": '''
                """Lengths."""

                import math


                def norm(u):
                    """Euclidean length."""
                    return math.sqrt(sum(a * a for a in u))
            ''',
        },
        "base_test": ("from vectors.core import dot", "self.assertEqual(dot((1, 2), (3, 4)), 11)"),
        "features": [
            {
                "slug": "subtract",
                "module": "vectors/core.py",
                "anchor": "add",
                "md": "Add `subtract(u, v)` to `vectors/core.py`: the element-wise difference u - v as a tuple; raise `ValueError` when the lengths differ.",
                "code": '''
                    def subtract(u, v):
                        """Element-wise u - v; ValueError for different lengths."""
                        if len(u) != len(v):
                            raise ValueError("lengths differ")
                        return tuple(a - b for a, b in zip(u, v))
                ''',
                "imports": "from vectors.core import subtract",
                "visible": ["self.assertEqual(subtract((3, 3), (1, 2)), (2, 1))"],
                "hidden": ["self.assertEqual(subtract((), ()), ())", "self.assertRaises(ValueError, subtract, (1,), (1, 2))"],
            },
            {
                "slug": "cross",
                "module": "vectors/core.py",
                "anchor": "scale",
                "md": "Add `cross(u, v)` to `vectors/core.py`: the cross product of two 3-dimensional vectors as a tuple; raise `ValueError` for any other length.",
                "code": '''
                    def cross(u, v):
                        """Cross product of two 3-vectors; ValueError otherwise."""
                        if len(u) != 3 or len(v) != 3:
                            raise ValueError("cross product needs 3-vectors")
                        return (u[1] * v[2] - u[2] * v[1], u[2] * v[0] - u[0] * v[2], u[0] * v[1] - u[1] * v[0])
                ''',
                "imports": "from vectors.core import cross",
                "visible": ["self.assertEqual(cross((1, 0, 0), (0, 1, 0)), (0, 0, 1))"],
                "hidden": [
                    "self.assertEqual(cross((2, 3, 4), (5, 6, 7)), (-3, 6, -3))",
                    "self.assertRaises(ValueError, cross, (1, 2), (3, 4))",
                ],
            },
            {
                "slug": "normalize",
                "module": "vectors/extra.py",
                "anchor": "norm",
                "md": "Add `normalize(u)` to `vectors/extra.py`: the unit vector in u's direction as a tuple; raise `ValueError` for the zero vector.",
                "code": '''
                    def normalize(u):
                        """u scaled to length 1; ValueError for the zero vector."""
                        n = norm(u)
                        if n == 0:
                            raise ValueError("zero vector")
                        return tuple(a / n for a in u)
                ''',
                "imports": "from vectors.extra import normalize",
                "visible": ["self.assertEqual(normalize((3, 4)), (0.6, 0.8))"],
                "hidden": ["self.assertEqual(normalize((0, 5)), (0.0, 1.0))", "self.assertRaises(ValueError, normalize, (0, 0))"],
            },
        ],
    },
    {
        "name": "calendar_tools",
        "split": "train",
        "files": {
            "calendar_tools/core.py": '''
                """Calendar arithmetic."""


                def is_leap(year):
                    """Gregorian leap year."""
                    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


                def days_in_month(year, month):
                    """Days in a month of a year."""
                    if month == 2:
                        return 29 if is_leap(year) else 28
                    return 30 if month in (4, 6, 9, 11) else 31


                def days_in_year(year):
                    """365 or 366."""
                    return 366 if is_leap(year) else 365
            ''',
            "calendar_tools/extra.py": '''
                """Reading dates."""


                def parse_iso(text):
                    """'2024-03-01' -> (2024, 3, 1)."""
                    y, m, d = text.split("-")
                    return int(y), int(m), int(d)
            ''',
        },
        "base_test": ("from calendar_tools.core import is_leap", "self.assertTrue(is_leap(2000))"),
        "features": [
            {
                "slug": "day_of_year",
                "module": "calendar_tools/core.py",
                "anchor": "days_in_month",
                "md": "Add `day_of_year(year, month, day)` to `calendar_tools/core.py`: the day's number within its year, 1 for January 1st.",
                "code": '''
                    def day_of_year(year, month, day):
                        """1 for January 1st."""
                        return sum(days_in_month(year, m) for m in range(1, month)) + day
                ''',
                "imports": "from calendar_tools.core import day_of_year",
                "visible": ["self.assertEqual(day_of_year(2023, 1, 1), 1)"],
                "hidden": ["self.assertEqual(day_of_year(2024, 3, 1), 61)", "self.assertEqual(day_of_year(2023, 12, 31), 365)"],
            },
            {
                "slug": "month_name",
                "module": "calendar_tools/core.py",
                "anchor": "is_leap",
                "md": "Add `month_name(month)` to `calendar_tools/core.py`: the English name of month 1-12 ('January' ...); raise `ValueError` outside 1-12.",
                "code": '''
                    def month_name(month):
                        """'January' for 1; ValueError outside 1-12."""
                        names = ["January", "February", "March", "April", "May", "June", "July",
                                 "August", "September", "October", "November", "December"]
                        if not 1 <= month <= 12:
                            raise ValueError("month must be 1-12")
                        return names[month - 1]
                ''',
                "imports": "from calendar_tools.core import month_name",
                "visible": ["self.assertEqual(month_name(1), 'January')"],
                "hidden": ["self.assertEqual(month_name(12), 'December')", "self.assertRaises(ValueError, month_name, 0)"],
            },
            {
                "slug": "format_date",
                "module": "calendar_tools/extra.py",
                "anchor": "parse_iso",
                "md": "Add `format_date(year, month, day, style='iso')` to `calendar_tools/extra.py`: 'iso' gives '2024-03-01', 'us' gives '03/01/2024'; raise `ValueError` for another style.",
                "code": '''
                    def format_date(year, month, day, style="iso"):
                        """'iso': 2024-03-01, 'us': 03/01/2024; ValueError for other styles."""
                        if style == "iso":
                            return f"{year:04d}-{month:02d}-{day:02d}"
                        if style == "us":
                            return f"{month:02d}/{day:02d}/{year:04d}"
                        raise ValueError("unknown style")
                ''',
                "imports": "from calendar_tools.extra import format_date",
                "visible": ["self.assertEqual(format_date(2024, 3, 1), '2024-03-01')"],
                "hidden": [
                    "self.assertEqual(format_date(2024, 3, 1, 'us'), '03/01/2024')",
                    "self.assertRaises(ValueError, format_date, 2024, 3, 1, 'eu')",
                ],
            },
        ],
    },
    {
        "name": "ledger",
        "split": "train",
        "files": {
            "ledger/core.py": '''
                """Balances of an account."""


                def deposit(balance, amount):
                    """Balance after a deposit; ValueError for a non-positive amount."""
                    if amount <= 0:
                        raise ValueError("amount must be positive")
                    return balance + amount


                def withdraw(balance, amount):
                    """Balance after a withdrawal; ValueError when it would overdraw."""
                    if amount > balance:
                        raise ValueError("insufficient funds")
                    return balance - amount


                def can_afford(balance, amount):
                    """Whether a withdrawal would go through."""
                    return 0 < amount <= balance
            ''',
            "ledger/extra.py": '''
                """Statements."""


                def statement(transactions):
                    """One signed amount per line."""
                    return "\\n".join(f"{t:+.2f}" for t in transactions)
            ''',
        },
        "base_test": ("from ledger.core import deposit", "self.assertEqual(deposit(1, 2), 3)"),
        "features": [
            {
                "slug": "compound_interest",
                "module": "ledger/core.py",
                "anchor": "deposit",
                "md": "Add `compound_interest(balance, rate, years)` to `ledger/core.py`: the balance after `years` years of interest at `rate` per year compounded yearly, rounded to 2 decimals.",
                "code": '''
                    def compound_interest(balance, rate, years):
                        """Balance after yearly compounding, rounded to cents."""
                        return round(balance * (1 + rate) ** years, 2)
                ''',
                "imports": "from ledger.core import compound_interest",
                "visible": ["self.assertEqual(compound_interest(100, 0.1, 1), 110)"],
                "hidden": ["self.assertEqual(compound_interest(100, 0.1, 2), 121)", "self.assertEqual(compound_interest(50, 0.05, 0), 50)"],
            },
            {
                "slug": "transfer",
                "module": "ledger/core.py",
                "anchor": "can_afford",
                "md": "Add `transfer(source, target, amount)` to `ledger/core.py`: returns the two new balances `(source - amount, target + amount)`; raise `ValueError` when the source cannot afford it or the amount is not positive.",
                "code": '''
                    def transfer(source, target, amount):
                        """(source - amount, target + amount); ValueError if it cannot go through."""
                        if not can_afford(source, amount):
                            raise ValueError("transfer not possible")
                        return source - amount, target + amount
                ''',
                "imports": "from ledger.core import transfer",
                "visible": ["self.assertEqual(transfer(10, 0, 4), (6, 4))"],
                "hidden": ["self.assertRaises(ValueError, transfer, 1, 0, 2)", "self.assertRaises(ValueError, transfer, 5, 0, 0)"],
            },
            {
                "slug": "summarize",
                "module": "ledger/extra.py",
                "anchor": "statement",
                "md": "Add `summarize(transactions)` to `ledger/extra.py`: for a list of signed amounts, the pair (total deposited, total withdrawn), both as positive numbers.",
                "code": '''
                    def summarize(transactions):
                        """(total deposited, total withdrawn), both positive."""
                        deposits = sum(t for t in transactions if t > 0)
                        withdrawals = -sum(t for t in transactions if t < 0)
                        return deposits, withdrawals
                ''',
                "imports": "from ledger.extra import summarize",
                "visible": ["self.assertEqual(summarize([5, -2]), (5, 2))"],
                "hidden": ["self.assertEqual(summarize([]), (0, 0))", "self.assertEqual(summarize([1, 2, -3, -4]), (3, 7))"],
            },
        ],
    },
    {
        "name": "gradebook",
        "split": "train",
        "files": {
            "gradebook/core.py": '''
                """Scores out of 100."""


                def average(scores):
                    """Mean score; ValueError for no scores."""
                    if not scores:
                        raise ValueError("no scores")
                    return sum(scores) / len(scores)


                def letter(score):
                    """A (90+), B (80+), C (70+), D (60+) or F."""
                    for cutoff, grade in ((90, "A"), (80, "B"), (70, "C"), (60, "D")):
                        if score >= cutoff:
                            return grade
                    return "F"


                def passed(score):
                    """60 or more passes."""
                    return score >= 60
            ''',
            "gradebook/extra.py": '''
                """Distributions."""


                def histogram(scores):
                    """Letter -> count."""
                    from gradebook.core import letter

                    out = {}
                    for s in scores:
                        out[letter(s)] = out.get(letter(s), 0) + 1
                    return out
            ''',
        },
        "base_test": ("from gradebook.core import letter", "self.assertEqual(letter(85), 'B')"),
        "features": [
            {
                "slug": "median",
                "module": "gradebook/core.py",
                "anchor": "average",
                "md": "Add `median(scores)` to `gradebook/core.py`: the median score (the mean of the two middle ones for an even count); raise `ValueError` for no scores.",
                "code": '''
                    def median(scores):
                        """Middle score, mean of the middle two for even counts; ValueError if none."""
                        if not scores:
                            raise ValueError("no scores")
                        s = sorted(scores)
                        mid = len(s) // 2
                        return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
                ''',
                "imports": "from gradebook.core import median",
                "visible": ["self.assertEqual(median([3, 1, 2]), 2)"],
                "hidden": ["self.assertEqual(median([4, 1, 3, 2]), 2.5)", "self.assertRaises(ValueError, median, [])"],
            },
            {
                "slug": "curve",
                "module": "gradebook/core.py",
                "anchor": "passed",
                "md": "Add `curve(scores, target)` to `gradebook/core.py`: shift every score by the same amount so the mean becomes `target`, capping each at 100; returns a new list.",
                "code": '''
                    def curve(scores, target):
                        """Shift all scores so the mean is target, capped at 100."""
                        shift = target - average(scores)
                        return [min(100, s + shift) for s in scores]
                ''',
                "imports": "from gradebook.core import curve",
                "visible": ["self.assertEqual(curve([50, 70], 70), [60, 80])"],
                "hidden": ["self.assertEqual(curve([90, 100], 100), [95, 100])", "self.assertEqual(curve([80], 80), [80])"],
            },
            {
                "slug": "ranking",
                "module": "gradebook/extra.py",
                "anchor": "histogram",
                "md": "Add `ranking(results)` to `gradebook/extra.py`: for a dict name -> score, the names ordered by score, highest first, ties broken alphabetically.",
                "code": '''
                    def ranking(results):
                        """Names by score, highest first, ties alphabetically."""
                        return sorted(results, key=lambda name: (-results[name], name))
                ''',
                "imports": "from gradebook.extra import ranking",
                "visible": ["self.assertEqual(ranking({'a': 1, 'b': 2}), ['b', 'a'])"],
                "hidden": ["self.assertEqual(ranking({'c': 5, 'a': 5, 'b': 9}), ['b', 'a', 'c'])", "self.assertEqual(ranking({}), [])"],
            },
        ],
    },
    {
        "name": "urltools",
        "split": "validation",
        "files": {
            "urltools/core.py": '''
                """Query strings."""


                def split_query(query):
                    """'a=1&b=2' -> {'a': '1', 'b': '2'}."""
                    return dict(part.split("=", 1) for part in query.split("&") if part)


                def join_query(params):
                    """{'a': '1'} -> 'a=1', keys sorted."""
                    return "&".join(f"{k}={v}" for k, v in sorted(params.items()))


                def has_query(url):
                    """Whether the URL has a query string."""
                    return "?" in url
            ''',
            "urltools/extra.py": '''
                """URL kinds."""


                def is_absolute(url):
                    """Whether the URL names a scheme."""
                    return "://" in url
            ''',
        },
        "base_test": ("from urltools.core import join_query", "self.assertEqual(join_query({'b': 2, 'a': 1}), 'a=1&b=2')"),
        "features": [
            {
                "slug": "add_param",
                "module": "urltools/core.py",
                "anchor": "split_query",
                "md": "Add `add_param(url, key, value)` to `urltools/core.py`: the URL with `key=value` added to its query string (with '?' when it has none, '&' otherwise).",
                "code": '''
                    def add_param(url, key, value):
                        """url with key=value appended to its query."""
                        sep = "&" if "?" in url else "?"
                        return f"{url}{sep}{key}={value}"
                ''',
                "imports": "from urltools.core import add_param",
                "visible": ["self.assertEqual(add_param('http://x', 'a', 1), 'http://x?a=1')"],
                "hidden": ["self.assertEqual(add_param('http://x?a=1', 'b', 2), 'http://x?a=1&b=2')"],
            },
            {
                "slug": "strip_fragment",
                "module": "urltools/core.py",
                "anchor": "has_query",
                "md": "Add `strip_fragment(url)` to `urltools/core.py`: the URL without its '#fragment' part (unchanged when it has none).",
                "code": '''
                    def strip_fragment(url):
                        """url without its #fragment."""
                        return url.split("#", 1)[0]
                ''',
                "imports": "from urltools.core import strip_fragment",
                "visible": ["self.assertEqual(strip_fragment('http://x#top'), 'http://x')"],
                "hidden": [
                    "self.assertEqual(strip_fragment('http://x?a=1#b#c'), 'http://x?a=1')",
                    "self.assertEqual(strip_fragment('http://x'), 'http://x')",
                ],
            },
            {
                "slug": "hostname",
                "module": "urltools/extra.py",
                "anchor": "is_absolute",
                "md": "Add `hostname(url)` to `urltools/extra.py`: the host of an absolute URL, lower-cased, without port, user or path ('http://User@Example.COM:80/a' -> 'example.com').",
                "code": '''
                    def hostname(url):
                        """Lower-cased host without port, user or path."""
                        rest = url.split("://", 1)[1]
                        netloc = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
                        return netloc.rsplit("@", 1)[-1].split(":", 1)[0].lower()
                ''',
                "imports": "from urltools.extra import hostname",
                "visible": ["self.assertEqual(hostname('http://example.com/a'), 'example.com')"],
                "hidden": [
                    "self.assertEqual(hostname('http://User@Example.COM:80/a'), 'example.com')",
                    "self.assertEqual(hostname('https://a.b?q=1'), 'a.b')",
                ],
            },
        ],
    },
    {
        "name": "shapes",
        "split": "validation",
        "files": {
            "shapes/core.py": '''
                """Areas and perimeters."""

                import math


                def circle_area(r):
                    """Area of a circle of radius r."""
                    return math.pi * r * r


                def rect_area(w, h):
                    """Area of a w by h rectangle."""
                    return w * h


                def rect_perimeter(w, h):
                    """Perimeter of a w by h rectangle."""
                    return 2 * (w + h)
            ''',
            "shapes/extra.py": '''
                """Describing shapes."""


                def describe(name, area):
                    """'circle: 3.14'."""
                    return f"{name}: {area:.2f}"
            ''',
        },
        "base_test": ("from shapes.core import rect_area", "self.assertEqual(rect_area(2, 3), 6)"),
        "features": [
            {
                "slug": "triangle_area",
                "module": "shapes/core.py",
                "anchor": "circle_area",
                "md": "Add `triangle_area(a, b, c)` to `shapes/core.py`: the area of a triangle from its three sides (Heron's formula); raise `ValueError` when the sides cannot form a triangle.",
                "code": '''
                    def triangle_area(a, b, c):
                        """Heron's formula; ValueError for impossible sides."""
                        if a + b <= c or a + c <= b or b + c <= a:
                            raise ValueError("not a triangle")
                        s = (a + b + c) / 2
                        return math.sqrt(s * (s - a) * (s - b) * (s - c))
                ''',
                "imports": "from shapes.core import triangle_area",
                "visible": ["self.assertAlmostEqual(triangle_area(3, 4, 5), 6)"],
                "hidden": [
                    "self.assertAlmostEqual(triangle_area(2, 2, 2), 1.7320508075688772)",
                    "self.assertRaises(ValueError, triangle_area, 1, 1, 3)",
                ],
            },
            {
                "slug": "circle_perimeter",
                "module": "shapes/core.py",
                "anchor": "rect_perimeter",
                "md": "Add `circle_perimeter(r)` to `shapes/core.py`: the circumference of a circle of radius r; raise `ValueError` for a negative radius.",
                "code": '''
                    def circle_perimeter(r):
                        """2 pi r; ValueError for a negative radius."""
                        if r < 0:
                            raise ValueError("negative radius")
                        return 2 * math.pi * r
                ''',
                "imports": "from shapes.core import circle_perimeter",
                "visible": ["self.assertAlmostEqual(circle_perimeter(1), 6.283185307179586)"],
                "hidden": ["self.assertEqual(circle_perimeter(0), 0)", "self.assertRaises(ValueError, circle_perimeter, -1)"],
            },
            {
                "slug": "largest",
                "module": "shapes/extra.py",
                "anchor": "describe",
                "md": "Add `largest(shapes)` to `shapes/extra.py`: for a list of (name, area) pairs, the name with the largest area (the first on ties); `None` for an empty list.",
                "code": '''
                    def largest(shapes):
                        """Name of the largest area, first on ties; None if empty."""
                        best = None
                        for name, area in shapes:
                            if best is None or area > best[1]:
                                best = (name, area)
                        return best[0] if best else None
                ''',
                "imports": "from shapes.extra import largest",
                "visible": ["self.assertEqual(largest([('a', 1), ('b', 2)]), 'b')"],
                "hidden": ["self.assertEqual(largest([('a', 2), ('b', 2)]), 'a')", "self.assertIsNone(largest([]))"],
            },
        ],
    },
    {
        "name": "caseconv",
        "split": "test",
        "files": {
            "caseconv/core.py": '''
                """Identifier case styles."""

                import re


                def snake_to_camel(name):
                    """'my_var' -> 'myVar'."""
                    head, *rest = name.split("_")
                    return head + "".join(p.capitalize() for p in rest)


                def camel_to_snake(name):
                    """'myVar' -> 'my_var'."""
                    return re.sub(r"(?<!^)([A-Z])", r"_\\1", name).lower()


                def is_snake(name):
                    """Lower-case words joined by underscores."""
                    return re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+)*", name) is not None
            ''',
            "caseconv/extra.py": '''
                """Text for URLs."""

                import re


                def slugify(text):
                    """'Hello, World' -> 'hello-world'."""
                    return "-".join(re.findall(r"[a-z0-9]+", text.lower()))
            ''',
        },
        "base_test": ("from caseconv.core import snake_to_camel", "self.assertEqual(snake_to_camel('a_b'), 'aB')"),
        "features": [
            {
                "slug": "snake_to_pascal",
                "module": "caseconv/core.py",
                "anchor": "snake_to_camel",
                "md": "Add `snake_to_pascal(name)` to `caseconv/core.py`: 'my_var_name' -> 'MyVarName'.",
                "code": '''
                    def snake_to_pascal(name):
                        """'my_var' -> 'MyVar'."""
                        return "".join(p.capitalize() for p in name.split("_"))
                ''',
                "imports": "from caseconv.core import snake_to_pascal",
                "visible": ["self.assertEqual(snake_to_pascal('my_var'), 'MyVar')"],
                "hidden": [
                    "self.assertEqual(snake_to_pascal('a'), 'A')",
                    "self.assertEqual(snake_to_pascal('http_server_v2'), 'HttpServerV2')",
                ],
            },
            {
                "slug": "kebab_to_snake",
                "module": "caseconv/core.py",
                "anchor": "is_snake",
                "md": "Add `kebab_to_snake(name)` to `caseconv/core.py`: 'My-Var-Name' -> 'my_var_name' (dashes become underscores, lower-cased).",
                "code": '''
                    def kebab_to_snake(name):
                        """'My-Var' -> 'my_var'."""
                        return name.replace("-", "_").lower()
                ''',
                "imports": "from caseconv.core import kebab_to_snake",
                "visible": ["self.assertEqual(kebab_to_snake('a-b'), 'a_b')"],
                "hidden": ["self.assertEqual(kebab_to_snake('My-Var-Name'), 'my_var_name')", "self.assertEqual(kebab_to_snake('x'), 'x')"],
            },
            {
                "slug": "truncate_words",
                "module": "caseconv/extra.py",
                "anchor": "slugify",
                "md": "Add `truncate_words(text, n)` to `caseconv/extra.py`: the first n words joined by single spaces, followed by '...' when words were cut off.",
                "code": '''
                    def truncate_words(text, n):
                        """The first n words, '...' appended when some were cut."""
                        words = text.split()
                        return " ".join(words[:n]) + ("..." if len(words) > n else "")
                ''',
                "imports": "from caseconv.extra import truncate_words",
                "visible": ["self.assertEqual(truncate_words('a b c', 2), 'a b...')"],
                "hidden": ["self.assertEqual(truncate_words('a  b', 5), 'a b')", "self.assertEqual(truncate_words('a b', 0), '...')"],
            },
        ],
    },
    {
        "name": "numerals",
        "split": "test",
        "files": {
            "numerals/core.py": '''
                """Roman numerals."""

                VALUES = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
                          (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]


                def to_roman(n):
                    """1994 -> 'MCMXCIV' (1-3999)."""
                    out = ""
                    for value, symbol in VALUES:
                        while n >= value:
                            out += symbol
                            n -= value
                    return out


                def from_roman(text):
                    """'MCMXCIV' -> 1994."""
                    digits = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
                    total = 0
                    for a, b in zip(text, text[1:] + " "):
                        v = digits[a]
                        total += -v if b != " " and digits[b] > v else v
                    return total


                def roman_length(n):
                    """Number of symbols in n's numeral."""
                    return len(to_roman(n))
            ''',
            "numerals/extra.py": '''
                """Ordinals."""


                def ordinal(n):
                    """1 -> '1st', 12 -> '12th', 23 -> '23rd'."""
                    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
                    return f"{n}{suffix}"
            ''',
        },
        "base_test": ("from numerals.core import to_roman", "self.assertEqual(to_roman(1994), 'MCMXCIV')"),
        "features": [
            {
                "slug": "is_roman",
                "module": "numerals/core.py",
                "anchor": "to_roman",
                "md": "Add `is_roman(text)` to `numerals/core.py`: whether the text is a well-formed Roman numeral for a number from 1 to 3999 (that is, exactly what `to_roman` would write).",
                "code": '''
                    def is_roman(text):
                        """Whether text is the canonical numeral of some 1-3999."""
                        if not text or set(text) - set("IVXLCDM"):
                            return False
                        value = from_roman(text)
                        return 1 <= value <= 3999 and to_roman(value) == text
                ''',
                "imports": "from numerals.core import is_roman",
                "visible": ["self.assertTrue(is_roman('XIV'))"],
                "hidden": ["self.assertFalse(is_roman('IIII'))", "self.assertFalse(is_roman(''))", "self.assertFalse(is_roman('XA'))"],
            },
            {
                "slug": "roman_add",
                "module": "numerals/core.py",
                "anchor": "roman_length",
                "md": "Add `roman_add(a, b)` to `numerals/core.py`: the sum of two Roman numerals, as a Roman numeral ('IX', 'III' -> 'XII').",
                "code": '''
                    def roman_add(a, b):
                        """Sum of two numerals as a numeral."""
                        return to_roman(from_roman(a) + from_roman(b))
                ''',
                "imports": "from numerals.core import roman_add",
                "visible": ["self.assertEqual(roman_add('I', 'I'), 'II')"],
                "hidden": ["self.assertEqual(roman_add('IX', 'III'), 'XII')", "self.assertEqual(roman_add('MCM', 'XCIV'), 'MCMXCIV')"],
            },
            {
                "slug": "number_words",
                "module": "numerals/extra.py",
                "anchor": "ordinal",
                "md": "Add `number_words(n)` to `numerals/extra.py`: English words for 0-99 ('zero', 'seventeen', 'forty-two'); raise `ValueError` outside that range.",
                "code": '''
                    def number_words(n):
                        """English words for 0-99; ValueError otherwise."""
                        ones = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
                                "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
                        tens = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
                        if not 0 <= n <= 99:
                            raise ValueError("0-99 only")
                        if n < 20:
                            return ones[n]
                        return tens[n // 10] + ("-" + ones[n % 10] if n % 10 else "")
                ''',
                "imports": "from numerals.extra import number_words",
                "visible": ["self.assertEqual(number_words(7), 'seven')"],
                "hidden": [
                    "self.assertEqual(number_words(42), 'forty-two')",
                    "self.assertEqual(number_words(90), 'ninety')",
                    "self.assertRaises(ValueError, number_words, 100)",
                ],
            },
        ],
    },
]
