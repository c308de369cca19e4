"""Ad-hoc check of lead_ids' margin on the packaged SmolLM2 tokenizer: random mixed text cut at a
random place; the lead's ids must begin the whole text's ids. Then a lead's cost against the
whole text's at a few lengths (repetitive text: the tokenizer's word cache helps both)."""
import random
import time

from kvgate.index.kv.tokenizer import load_tokenizer
from kvgate.index.kv.tokenizer_light import lead_ids

tok = load_tokenizer("smollm2")
rust = tok._rust
rng = random.Random(1)
alpha = list("abcdefghij klmnop qrstuv wxyz,.;:!?0123456789\n\t  ") + ["的", "は", "😀", "é", "  ", "\n\n", "    ", "def ", "()", "{}", "1234567"]
bad = 0
for trial in range(3000):
    text = "".join(rng.choice(alpha) for _ in range(rng.randint(200, 3000) // 2))
    cut = rng.randint(10, len(text))
    whole = rust.encode_batch([text], add_special_tokens=False)[0].ids
    keep = lead_ids(rust, text, cut)
    bad += whole[: len(keep)] != keep
print("mismatches", bad)
text = "The quick brown fox jumps over the lazy dog. " * 3000
for n in (2000, 8000, 32000, 128000):
    t = text[:n]
    s = time.perf_counter()
    for _ in range(5):
        rust.encode_batch([t], add_special_tokens=False)
    full = (time.perf_counter() - s) / 5
    s = time.perf_counter()
    for _ in range(5):
        lead_ids(rust, t, 2176)
    lead = (time.perf_counter() - s) / 5
    print(n, f"whole {full * 1e3:.2f} ms, lead {lead * 1e3:.2f} ms")
