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
