"""Write the bundled `chat-train` prompt set: general assistant requests, no benchmark.

    python examples/make_chat_prompts.py

MT-Bench asks for writing, role-play, reasoning, extraction, STEM and humanities
answers; a drafter trained only on maths and code answers accepts little there. These
prompts cross everyday, scientific and historical topics with request shapes of those
kinds ("explain", "write a short blog post", "role-play a guide", "extract as JSON",
...), so the target's own answers to them teach the drafter its chat style. They are
written from the lists below, never from MT-Bench's questions. Only the prompts come
from here: the target writes the responses. Output:
dflash_mlx/data/train_chat.jsonl.gz (deterministic).
"""

import gzip
import json
from pathlib import Path

OUT = Path(__file__).parents[1] / "dflash_mlx" / "data" / "train_chat.jsonl.gz"

TOPICS = (
    "renewable energy", "the Roman Empire", "photosynthesis", "remote work",
    "machine learning", "coffee", "volcanoes", "chess", "personal budgeting",
    "the French Revolution", "black holes", "vaccines", "public libraries",
    "electric cars", "the water cycle", "jazz music", "urban gardening", "sleep",
    "the printing press", "climate change", "honeybees", "the stock market",
    "ancient Egypt", "plate tectonics", "social media", "marathon training",
    "the human heart", "recycling", "the Renaissance", "solar eclipses",
    "learning a second language", "the Silk Road", "antibiotics", "3D printing",
    "coral reefs", "minimalism", "the Industrial Revolution", "quantum computing",
    "bread baking", "the Moon landing", "inflation", "rainforests", "meditation",
    "the Olympic Games", "DNA", "public transport", "Shakespeare's plays",
    "earthquakes", "online privacy", "the Great Wall of China", "nutrition labels",
    "wind turbines", "impressionist painting", "the immune system", "time management",
    "the Cold War", "desert ecosystems", "cryptocurrency", "board games",
    "the theory of evolution", "hiking safety", "classical music", "glaciers",
    "job interviews", "the Aztec civilization", "artificial sweeteners", "tides",
    "composting", "the scientific method", "video game design", "migratory birds",
    "the Enlightenment", "electric circuits", "volunteering", "the Mars rovers",
    "small business marketing", "ocean currents", "the history of the internet",
    "houseplants", "the Black Death", "nuclear power", "photography",
    "the Pythagorean theorem", "friendship", "the Amazon river", "fermentation",
    "the Byzantine Empire", "smartphones", "hurricanes", "public speaking",
    "the periodic table", "world heritage sites", "dinosaurs", "the gig economy",
    "ancient Greek philosophy", "weather forecasting", "cycling to work",
    "the human brain", "folk tales", "supply chains",
)  # fmt: skip

REQUESTS = (
    "Write a short blog post about {}, with a catchy title.",
    "Explain {} to someone with no background in it, in simple terms.",
    "What are the main advantages and disadvantages of {}?",
    "Write a persuasive email convincing a friend to learn more about {}.",
    "Pretend you are a museum guide who loves {}. Introduce it to a group of visitors.",
    "Summarize the key ideas behind {} in five bullet points.",
    "Compose a short poem about {}.",
    "Describe a common misconception about {} and correct it.",
    "Give three practical tips for a beginner who is curious about {}.",
    "How has our understanding of {} changed over time?",
    "Write a short dialogue between a student and a teacher discussing {}.",
    "List the three most important facts about {} as a JSON array of strings.",
)


def main():
    rows = [
        {"id": f"chat-train/{r}/{t}", "prompt": request.format(topic)}
        for r, request in enumerate(REQUESTS)
        for t, topic in enumerate(TOPICS)
    ]
    text = "".join(json.dumps(row) + "\n" for row in rows)
    with gzip.GzipFile(OUT, "wb", mtime=0) as f:  # mtime 0: byte-identical reruns
        f.write(text.encode())
    print(f"wrote {len(rows)} prompts to {OUT}")


if __name__ == "__main__":
    main()
