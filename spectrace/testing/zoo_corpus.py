"""The synthetic corpus the zoo's target is trained on (pure Python, deterministic).

Every document is drawn from ``random.Random(seed)`` alone, so the same seed gives the
same text on any machine. The kinds are chosen so that a 4-layer model learns greedy
continuations a drafter can predict, and so that some of them need context further back
than a few tokens (copies, long patterns), where a drafter's sliding window matters:

- counting: ``count by 3 from 12: 12 15 18 21 ...``
- code: ``def f_7(x): y = x * 7; return y + 7`` repeated over a few functions
- patterns: a short motif of words repeated (``moon star sun | moon star sun | ...``)
- copies: a random word list, ``=>``, the same list again (the target must look back)

    from spectrace.testing.zoo_corpus import documents
    docs = documents(seed=0, n=4000)
"""

from __future__ import annotations

import random

WORDS = (
    "moon star sun rain tree river stone cloud fire wind snow leaf bird fish wolf bear "
    "red blue green gold black white grey pink "
    "alpha beta gamma delta omega sigma kappa theta "
    "north south east west up down left right"
).split()
OPS = ("+", "-", "*")


def _counting(rng: random.Random) -> str:
    step = rng.choice((1, 1, 2, 3, 5, 10))
    start = rng.randrange(0, 400)
    n = rng.randint(24, 64)
    return f"count by {step} from {start}: " + " ".join(str(start + i * step) for i in range(n))


def _code(rng: random.Random) -> str:
    out = []
    for _ in range(rng.randint(3, 8)):
        k = rng.randint(1, 20)
        op = rng.choice(OPS)
        out.append(f"def f_{k}(x):\n    y = x {op} {k}\n    return y + {k}\n")
    return "\n".join(out)


def _pattern(rng: random.Random) -> str:
    motif = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6)))
    return " | ".join([motif] * rng.randint(6, 16))


def _copy(rng: random.Random) -> str:
    items = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40)))
    return f"copy: {items} => {items}"


KINDS = (_counting, _code, _pattern, _copy)


def documents(seed: int, n: int) -> list[str]:
    """``n`` documents, the same for the same ``seed``."""
    rng = random.Random(seed)
    return [rng.choice(KINDS)(rng) for _ in range(n)]


def prompts(seed: int, n: int, min_chars: int) -> list[str]:
    """Held-out prompts: documents of ``seed`` joined until each has ``min_chars``, then
    cut after the separator of its last document's kind so the continuation is predictable.
    """
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        text = ""
        while len(text) < min_chars:
            text += rng.choice(KINDS)(rng) + "\n\n"
        doc = rng.choice(KINDS)(rng)
        cut = max(len(doc) // 3, 1)
        out.append(text + doc[:cut])
    return out
