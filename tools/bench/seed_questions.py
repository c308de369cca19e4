"""The questions `kvgate bench semantic --entries` seeds through the proxy, their hand-written
paraphrases, and the list of semantic queries a run sends (kvgate.tools.bench.proxy_latency)."""

from __future__ import annotations

from kvgate.tools.bench.semantic_filler import Query, RealFiller, interleave

# (seed question, two hand-written paraphrases). Topics are kept apart so a paraphrase has one right seed.
SEED_QUESTIONS: tuple[tuple[str, str, str], ...] = (
    (
        "How do I reset my password if I forgot it?",
        "I forgot my password, how can I reset it?",
        "What is the way to reset a forgotten password?",
    ),
    (
        "What is the capital city of Australia?",
        "Which city is the capital of Australia?",
        "What city serves as Australia's capital?",
    ),
    (
        "How can I improve my sleep quality?",
        "How can I improve the quality of my sleep?",
        "How do I get better quality sleep?",
    ),
    (
        "What are the health benefits of drinking green tea?",
        "Is drinking green tea good for your health?",
        "What health benefits does green tea have?",
    ),
    (
        "How do I make a sourdough starter at home?",
        "What is the way to create a sourdough starter at home?",
        "How can I make my own sourdough starter?",
    ),
    (
        "What is the difference between a virus and a bacterium?",
        "How are viruses different from bacteria?",
        "What distinguishes a virus from a bacterium?",
    ),
    (
        "How do I convert Celsius to Fahrenheit?",
        "What is the formula to convert Celsius into Fahrenheit?",
        "How can I change a temperature from Celsius to Fahrenheit?",
    ),
    (
        "What are good exercises to strengthen my lower back?",
        "Which exercises strengthen the lower back?",
        "How can I build strength in my lower back with exercise?",
    ),
    (
        "How do I learn to play the guitar as a beginner?",
        "What is the best way for a beginner to learn guitar?",
        "How should a beginner start learning to play the guitar?",
    ),
    ("Why is the sky blue?", "What makes the sky look blue?", "Why does the sky appear blue during the day?"),
    (
        "How do I remove a red wine stain from a carpet?",
        "How can I get a red wine stain out of carpet?",
        "What is the best way to clean red wine off a carpet?",
    ),
    (
        "What is the best way to save money for retirement?",
        "How should I save money for my retirement?",
        "What are the best ways to save for retirement?",
    ),
    (
        "How do I write a good cover letter for a job application?",
        "How can I write a strong cover letter when applying for a job?",
        "What makes a good cover letter for a job application?",
    ),
    ("What causes earthquakes?", "Why do earthquakes happen?", "What is the cause of an earthquake?"),
    (
        "How do I grow tomatoes in pots?",
        "How can I grow tomatoes in containers?",
        "What is the best way to grow tomato plants in pots?",
    ),
    (
        "How long should I boil an egg for a soft yolk?",
        "How many minutes do I boil an egg to get a soft yolk?",
        "What is the boiling time for an egg with a soft yolk?",
    ),
    (
        "What is machine learning in simple terms?",
        "Can you explain machine learning in simple terms?",
        "What does machine learning mean in plain language?",
    ),
    (
        "How do I change a flat tire on my car?",
        "How can I replace a flat tire on a car?",
        "What are the steps to change a flat car tire?",
    ),
    (
        "What are the symptoms of dehydration?",
        "What are the signs that I am dehydrated?",
        "What symptoms show that someone is dehydrated?",
    ),
    (
        "How do I train my puppy to stop biting?",
        "How can I stop my puppy from biting?",
        "What is the best way to train a puppy not to bite?",
    ),
    (
        "What is the tallest mountain in the world?",
        "Which mountain is the highest in the world?",
        "What is the world's highest mountain?",
    ),
    (
        "How do I cook rice in a pot without a rice cooker?",
        "How can I cook rice on the stove without a rice cooker?",
        "What is the way to make rice in a pot instead of a rice cooker?",
    ),
    (
        "How can I reduce stress at work?",
        "What are ways to lower stress at my job?",
        "How do I reduce stress in my job?",
    ),
    ("What is the speed of light?", "How fast is the speed of light?", "What is the speed at which light travels?"),
    (
        "How do I clean a cast iron skillet?",
        "What is the right way to clean a cast iron pan?",
        "How should I wash a cast iron skillet?",
    ),
    (
        "What are the rules of chess for beginners?",
        "What are the basic chess rules for a beginner?",
        "How do the rules of chess work for beginners?",
    ),
    (
        "How do I start running if I am out of shape?",
        "How can I begin running when I am out of shape?",
        "What is a good way to start running when I am not fit?",
    ),
    ("How do vaccines work?", "How does a vaccine work in the body?", "What is the way vaccines work?"),
    (
        "How do I set up a home Wi-Fi network?",
        "How can I set up Wi-Fi at home?",
        "What are the steps to set up a Wi-Fi network at home?",
    ),
    (
        "What is the best way to learn a new language?",
        "How can I learn a new language effectively?",
        "What is the most effective way to learn a new language?",
    ),
    (
        "How do I unclog a kitchen sink drain?",
        "How can I unclog the drain of my kitchen sink?",
        "What is the best way to unclog my kitchen sink drain?",
    ),
    (
        "Why do leaves change color in autumn?",
        "Why do tree leaves change color in the fall?",
        "What makes leaves change colour in autumn?",
    ),
    (
        "How do I calculate compound interest?",
        "What is the formula for calculating compound interest?",
        "How can I work out compound interest?",
    ),
    (
        "How do I get rid of fruit flies in my kitchen?",
        "How can I eliminate fruit flies in the kitchen?",
        "What is the best way to get rid of kitchen fruit flies?",
    ),
    (
        "What are the main causes of climate change?",
        "What causes climate change?",
        "What are the primary causes of climate change?",
    ),
    (
        "How do I make cold brew coffee?",
        "How can I make cold brew coffee at home?",
        "What is the method for making cold brew coffee?",
    ),
    (
        "How do I negotiate a higher salary?",
        "How can I negotiate for a bigger salary?",
        "What is the best way to negotiate a higher salary?",
    ),
    (
        "How many planets are in our solar system?",
        "How many planets does our solar system have?",
        "What is the number of planets in the solar system?",
    ),
    ("How do I back up my iPhone?", "How can I make a backup of my iPhone?", "What is the way to back up an iPhone?"),
    (
        "What is the difference between weather and climate?",
        "How is weather different from climate?",
        "What distinguishes weather from climate?",
    ),
    (
        "How do I care for a succulent plant indoors?",
        "How should I take care of an indoor succulent plant?",
        "What is the right way to care for succulents indoors?",
    ),
    ("How do I fix a leaking faucet?", "How can I repair a leaking faucet?", "How do I repair a leaking faucet?"),
    (
        "What are the benefits of meditation?",
        "What are the advantages of meditating?",
        "What benefits does meditation have?",
    ),
    (
        "How do I write a for loop in Python?",
        "How can I write a for loop in Python?",
        "What is the syntax of a for loop in Python?",
    ),
    (
        "How do I prepare for a job interview?",
        "How should I get ready for a job interview?",
        "What is the best way to prepare for an interview for a job?",
    ),
    ("What is photosynthesis?", "Can you explain what photosynthesis is?", "What does photosynthesis mean?"),
    (
        "How do I jump start a car battery?",
        "How can I jump-start a dead car battery?",
        "What are the steps to jump start a car battery?",
    ),
    (
        "How much water should I drink every day?",
        "How much water should a person drink each day?",
        "What is the recommended amount of water to drink every day?",
    ),
    (
        "How do I make a budget for my household?",
        "How can I create a household budget?",
        "What is the best way to make a budget for my household?",
    ),
    (
        "What is the boiling point of water at high altitude?",
        "At what temperature does water boil at high altitude?",
        "What is water's boiling point at high altitudes?",
    ),
)
# Wrappers that make more distinct texts out of each hand-written paraphrase.
PARAPHRASE_WRAPPERS: tuple[str, ...] = (
    "{}",
    "Quick question: {}",
    "{} Thanks!",
    "Can you help me? {}",
    "Hi! {}",
    "I'd like to know: {}",
    "{} Please answer briefly.",
)


def paraphrases() -> list[tuple[int, str]]:
    """(seed index, text) for every distinct paraphrase, hand-written ones first, all texts unique."""
    out: list[tuple[int, str]] = []
    seen = {seed for seed, _, _ in SEED_QUESTIONS}
    for wrapper in PARAPHRASE_WRAPPERS:
        for column in (1, 2):
            for i, row in enumerate(SEED_QUESTIONS):
                text = wrapper.format(row[column])
                if text not in seen:
                    seen.add(text)
                    out.append((i, text))
    return out


def semantic_queries(queries: int, real: RealFiller | None) -> list[Query]:
    """The semantic pass's requests: seed paraphrases, and with the real filler held-out
    paraphrases and unrelated questions, interleaved; at most `queries`."""
    seeds = [Query("seed", text, i) for i, text in paraphrases()]
    if real is None:
        return seeds[:queries]
    return interleave(seeds, real.paraphrases, real.unrelated, limit=queries)
