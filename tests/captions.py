"""Short captions of shapes, things, colours, counts and places, drawn from a seed: the kind of
text the default model is for (the e4m3 tests compare embeddings and neighbours on them)."""

from __future__ import annotations

import numpy as np


def captions(n: int, seed: int = 1) -> list[str]:
    """Short captions of shapes, things, colours, counts and places: the kind of text the
    default model is for."""
    rng = np.random.default_rng(seed)
    colors = "red orange yellow green blue purple pink brown black white grey golden".split()
    shapes = "circle square triangle star hexagon heart cross ring diamond oval arrow moon".split()
    things = "cat dog horse bird fish car train boat plane house tree flower river city street market garden beach".split()
    verbs = "moves jumps sits rests spins falls rises floats glows shines waits runs".split()
    places = ["on the left", "on the right", "at the top", "at the bottom", "in the middle", "near the corner", "at night"]
    counts = "one two three four five six many several".split()
    forms = [
        lambda: f"{rng.choice(counts)} {rng.choice(colors)} {rng.choice(shapes)}s {rng.choice(places)}",
        lambda: f"a {rng.choice(colors)} {rng.choice(things)} {rng.choice(verbs)} {rng.choice(places)}",
        lambda: f"the {rng.choice(things)} and the {rng.choice(things)} {rng.choice(places)}, {rng.choice(colors)}",
    ]
    return [forms[int(rng.integers(len(forms)))]() for _ in range(n)]
