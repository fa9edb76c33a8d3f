"""Write the bundled `chat-train` and `chat-train-2` prompt sets: general assistant
requests, no benchmark.

    python examples/make_chat_prompts.py

MT-Bench asks for writing, role-play, reasoning, extraction, STEM and humanities
answers; a drafter trained only on maths and code answers accepts little there. These
prompts cross everyday, scientific and historical topics with request shapes of those
kinds ("explain", "write a short blog post", "role-play a guide", "extract as JSON",
...), so the target's own answers to them teach the drafter its chat style. They are
written from the lists below, never from MT-Bench's questions. Only the prompts come
from here: the target writes the responses. `chat-train-2` is the same requests over
100 more topics, a set of its own so that `chat-train` (and the split of every run
trained on it) stays as it was. Output: dflash_mlx/data/train_chat.jsonl.gz and
train_chat_2.jsonl.gz (deterministic).
"""

import gzip
import json
from pathlib import Path

DATA = Path(__file__).parents[1] / "dflash_mlx" / "data"

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

MORE_TOPICS = (
    "the Vikings", "tea ceremonies", "wildfires", "open-source software",
    "the Ottoman Empire", "magnetism", "kindness", "the metric system", "octopuses",
    "street food", "the Apollo program", "rivers and deltas", "credit scores",
    "the Harlem Renaissance", "microplastics", "origami", "the Maya calendar",
    "gravity", "podcasting", "the telegraph", "monsoons", "city planning",
    "the Great Barrier Reef", "probability", "letter writing", "the Mongol Empire",
    "spiders", "cloud computing", "the Suez Canal", "yoga", "lightning",
    "the Gutenberg Bible", "rainwater harvesting", "the Hubble telescope", "puzzles",
    "the Incas", "allergies", "electric guitars", "the Arctic", "bicycle repair",
    "the history of money", "penguins", "wind and sails", "the Magna Carta",
    "food waste", "robotics", "the Sahara", "handwriting", "the speed of light",
    "the Meiji Restoration", "pollinators", "email etiquette", "caves", "sculpture",
    "the Hanseatic League", "sound waves", "camping", "the Panama Canal",
    "wolves", "typography", "the Mughal Empire", "batteries", "gratitude",
    "the Dead Sea", "knitting", "the Wright brothers", "mushrooms", "opera",
    "the lymphatic system", "lighthouses", "the Phoenicians", "rainbows",
    "digital art", "the Transcontinental Railroad", "elephants", "negotiation",
    "the ozone layer", "ballet", "the Hundred Years' War", "prime numbers",
    "family recipes", "satellites", "the Galapagos Islands", "tattoos",
    "the Ming dynasty", "bridges", "journaling", "the Andes", "recycling electronics",
    "the human skeleton", "chess openings", "the Olympic torch", "deserts at night",
    "the history of medicine", "kites", "sea turtles", "the Louvre", "cheese making",
    "the Milky Way", "moving to a new city",
)  # fmt: skip

SETS = {  # file -> (set name, topics)
    "train_chat.jsonl.gz": ("chat-train", TOPICS),
    "train_chat_2.jsonl.gz": ("chat-train-2", MORE_TOPICS),
}

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


def prompts(name: str, topics: tuple) -> list[dict]:
    return [
        {"id": f"{name}/{r}/{t}", "prompt": request.format(topic)}
        for r, request in enumerate(REQUESTS)
        for t, topic in enumerate(topics)
    ]


def main():
    for file, (name, topics) in SETS.items():
        rows = prompts(name, topics)
        text = "".join(json.dumps(row) + "\n" for row in rows)
        out = DATA / file
        with gzip.GzipFile(out, "wb", mtime=0) as f:  # mtime 0: byte-identical reruns
            f.write(text.encode())
        print(f"wrote {len(rows)} prompts to {out}")


if __name__ == "__main__":
    main()
