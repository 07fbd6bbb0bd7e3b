"""Prompts for speculative decoding's benchmark and tests: work that repeats its context (edit a paragraph, refactor
code), where n-gram guesses should win, beside the random workloads, where they should cost little."""

# The random-text workload samples at this temperature: greedy decoding after random prompts falls into
# loops that n-gram guesses win on, sampled text does not repeat.
RANDOM_TEXT_TEMPERATURE = 1.0

PARAGRAPH = (
    "The harbour wakes before the town. At five the first boats slip their moorings, their engines coughing in the "
    "cold, and the gulls follow them out past the breakwater. By six the fish market is lit, the ice machines are "
    "humming, and the auctioneer is drinking his coffee on the steps, watching the sky for weather."
)

CODE = '''def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal = subtotal + item.price * item.quantity
    tax = subtotal * tax_rate
    return subtotal + tax


def average_price(items):
    count = 0
    total = 0
    for item in items:
        total = total + item.price
        count = count + 1
    return total / count
'''

REPETITIVE_PROMPTS = [
    f"Here is a paragraph:\n\n{PARAGRAPH}\n\nRepeat the paragraph word for word, but write 'seven' instead of "
    f"'six':\n\n",
    f"Here is some Python:\n\n{CODE}\nThe same code, with the variable `items` renamed to `products`:\n\n",
    f"{PARAGRAPH}\n\nCopy the text above exactly:\n\n",
    f"{CODE}\n# The same two functions again, unchanged:\n\n",
]
