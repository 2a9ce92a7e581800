"""Questions for the byte decoder's own phase: more phrasings, synonyms of the asked values,
near misses (:func:`decoder_question`)."""

from __future__ import annotations

import numpy as np

from .. import generate as g
from .captions import DIRECTION_WORDS, PITCH_WORDS, SHAPE_WORDS, SOUND_WORDS, Meaning, plural_of, meanings, phrase
from .questions import asks_of

# The recipe's second phase (``uform.training.decoder.train_decoder``) trains the byte decoder
# alone on these, mixed with ``question`` and ``generate.question``. None of them is a
# calibration phrasing (``CALIBRATION_ASK`` / ``_WHICH`` / ``_HOW_MANY``, tested), nor uses
# the calibration's distinctive words ("look", "number", "shown", "sound like", "pick"), so
# the calibration questions stay phrasings the decoder never saw. ``{v}`` is a word for the
# asked value, ``{n}`` the description's own noun for its subject ("box", "discs", "hiss").

VALUE_WORDS: dict[str, dict[str, tuple[str, ...]]] = {
    "colour": {c: (c,) for c in g.COLOURS},
    "shape": SHAPE_WORDS,
    "count": {"1": ("1", "one"), "2": ("2", "two"), "3": ("3", "three")},
    "direction": DIRECTION_WORDS,
    "sound": {"tone": ("tone", "note"), "chord": ("chord",), "noise": ("noise", "hiss"), "sweep": ("sweep",)},
    "pitch": {k: tuple(w) for k, w in PITCH_WORDS.items()},
    "rhythm": {"steady": ("steady", "constant"), "slow": ("slow", "slowly pulsing", "pulsing slowly"),
               "fast": ("fast", "quickly pulsing", "rapidly pulsing", "pulsing quickly")},  # fmt: skip
}
ATTRIBUTE_WORDS = {"colour": ("colour", "color", "hue"), "shape": ("shape", "form"), "count": ("count", "amount"),
                   "direction": ("direction", "motion", "movement"), "sound": ("sound", "kind of sound"), "pitch": ("pitch",),
                   "rhythm": ("rhythm", "pulse", "tempo")}  # fmt: skip
DECODER_ASK = {
    "colour": ("Is it {v}?", "Is the {n} {v}?", "Is it {v} in colour?", "Is the colour {v}?", "Is it a {v} one?", "Is it {v} or not?",
               "Is it true that it is {v}?", "Colour: {v}?", "Is the {n} coloured {v}?", "Is it painted {v}?", "Is it {v}, yes or no?",
               "Are they {v}?", "{v}?", "Is {v} its colour?", "Has it the colour {v}?"),
    "shape": ("Is it a {v}?", "Is the shape a {v}?", "Is it shaped as a {v}?", "Is it a {v} or not?", "Is it true that it is a {v}?",
              "Are they {v}s?", "Is that thing a {v}?", "Is it a {v}, yes or no?", "Is the form a {v}?", "A {v}?", "Is it drawn as a {v}?",
              "Is it in the shape of a {v}?"),
    "count": ("Are there {v}?", "Are there {v} of them?", "Are {v} drawn?", "Is it {v} shapes?", "Are there {v} {n}?", "Do you count {v}?",
              "Is the amount {v}?", "Are there exactly {v}?", "Is the count {v}, yes or no?", "{v} of them?", "Are there {v} in all?",
              "Do we have {v}?", "Can you see {v}?"),
    "direction": ("Is it moving {v}?", "Is the {n} moving {v}?", "Does the {n} move {v}?", "Is it travelling {v}?", "Is the motion {v}?",
                  "Is it heading {v}?", "Does it head {v}?", "Is the movement {v}?", "Is it moving {v} or not?", "Moving {v}, yes or no?",
                  "Is the direction of motion {v}?", "Does it slide {v}?", "Is it on its way {v}?", "{v}?"),
    "sound": ("Is it a {v}?", "Is the sound a {v}?", "Is it a {v} we hear?", "Do we hear a {v}?", "Is the recording a {v}?",
              "Is there a {v}?", "Is what plays a {v}?", "Is it a {v}, yes or no?", "Is it a {v} or not?", "Is the kind of sound a {v}?",
              "A {v}?", "Can you hear a {v}?"),
    "pitch": ("Is the pitch {v}?", "Is it a {v} {n}?", "Is the {n} {v}?", "Is it {v}?", "Is it pitched {v}?", "Is the pitch {v} or not?",
              "Is its pitch a {v} one?", "Is it at a {v} pitch?", "Is the {n} at a {v} pitch?", "Is it {v} in pitch?", "{v} pitch?"),
    "rhythm": ("Is the rhythm {v}?", "Is it {v}?", "Is the {n} {v}?", "Is the pulse {v}?", "Is the beat {v}?", "Is it {v} or not?",
               "Is the rhythm {v}, yes or no?", "Does it pulse {v}?", "Is the tempo {v}?", "Is the {n} a {v} one?", "{v}?"),
}  # fmt: skip
DECODER_WHICH = ("Which {a}?", "What {a} is it?", "What {a} does it have?", "Which {a} fits?", "Which of these is the {a}?",
                 "Which {a} does the {n} have?", "Which {a} best describes it?", "Choose the {a} it has.", "{A}?", "What {a}?",
                 "Which {a} is correct?", "Which is its {a}?", "Tell me the {a}.", "Which {a}, then?", "Give the {a}.")  # fmt: skip
DECODER_HOW_MANY = ("How many shapes?", "How many are there?", "How many {n}?", "How many {n} are there?", "How many are drawn?",
                    "How many can be seen?", "How many things are there?", "How many in all?", "Count of shapes?",
                    "How many {n} do you see?", "What is the amount?", "How many, exactly?")  # fmt: skip
DECODER_LEADS = ("", "", "", "", "", "Question: ", "Q: ", "Tell me, ", "Now, ", "Say, ", "Please answer: ", "One question: ", "Then, ")
DECODER_JOINS = (". ", ". ", ". ", ". ", "; ", "! ", " -- ", " ", ".\n", ". Then ", " - ")
DECODER_WRAPS = {
    "image": ("there is {c}", "it is {c}", "this is {c}", "we see {c}", "here is {c}", "an image of {c}", "a drawing of {c}"),
    "video": ("there is {c}", "it is {c}", "this is {c}", "we see {c}", "a video of {c}", "a clip of {c}", "here is {c}"),
    "audio": ("there is {c}", "it is {c}", "this is {c}", "we hear {c}", "a sound of {c}", "a clip of {c}", "here is {c}"),
}  # fmt: skip
DECODER_AFTER = {  # words about how it was made, which the answer does not depend on (not the calibration's EXTRA)
    "image": ("on grey", "drawn small", "with soft edges", "in the middle", "near a corner", "drawn large"),
    "video": ("for two seconds", "across the frame", "on grey", "drawn small", "at 10 frames a second"),
    "audio": ("for one second", "faintly", "with silence after it", "at 22 kHz", "then silence"),
}  # fmt: skip
OPTION_FORMS = ("{l}) {o}", "{l}) {o}", "{l}) {o}", "({l}) {o}", "{l}. {o}", "{l} - {o}")
OPTION_JOINS = (" ", " ", " ", ", ", "; ", " / ")


def _noun(m: Meaning, caption: str) -> str:
    """The description's own word for its subject: the shape word it uses (plural for two or three), or the sound's."""
    if m.modality == "audio":
        kind = m.attributes[0]
        words = ("tone", "note") if kind == "sweep" else SOUND_WORDS[kind]
        return next((w for w in words if w in caption), words[0])
    plural = m.modality == "image" and m.attributes[2] != "1"
    for w in sorted(SHAPE_WORDS[m.attributes[1]], key=len, reverse=True):
        said = plural_of(w) if plural else w
        if said in caption:
            return said
    return plural_of(m.attributes[1]) if plural else m.attributes[1]


def _capital(s: str) -> str:
    return s[:1].upper() + s[1:]


def decoder_question(rng: np.random.Generator, jumbled: float = 0.35, shuffled: float = 0.5) -> g.Question:
    """A question for the decoder's own phase: a paraphrased or jumbled description, sometimes
    wrapped (``there is …``), capitalised or followed by words about the medium that the answer
    does not depend on; asked in one of ``DECODER_ASK`` / ``DECODER_WHICH`` / ``DECODER_HOW_MANY``
    with the asked value in any of its words (``disc`` for a circle, ``deep`` for low), yes/no
    answers balanced and their wrong values drawn from the near misses too (another value of the
    same attribute); lettered options in several forms, in a random order with probability
    ``shuffled`` (the decoder phase's 0.5, the reading stage's 1.0), sometimes only some of them
    (the right one among them) or in other words."""
    modality = str(rng.choice(["image", "video", "audio"]))
    pool = meanings(modality)
    m = pool[int(rng.integers(0, len(pool)))]
    caption = phrase(rng, m, canonical=0.25, jumbled=jumbled)
    noun = _noun(m, caption)
    if rng.random() < 0.25:
        caption = str(rng.choice(DECODER_WRAPS[modality])).format(c=caption)
    if rng.random() < 0.15:
        caption = f"{caption} {rng.choice(DECODER_AFTER[modality])}"
    if rng.random() < 0.3:
        caption = _capital(caption)
    lead, join = str(rng.choice(DECODER_LEADS)), str(rng.choice(DECODER_JOINS))
    asks = asks_of(m)
    attribute, options, value = asks[int(rng.integers(0, len(asks)))]
    words = VALUE_WORDS[attribute]
    name = str(rng.choice(ATTRIBUTE_WORDS[attribute]))
    form = int(rng.integers(0, 3))
    if attribute == "count" and form == 2:
        asked = str(rng.choice(DECODER_HOW_MANY)).format(n=noun if m.attributes[2] != "1" else plural_of(noun))
        text, choices, answer, group = f"{asked} Answer 1, 2 or 3: ", "123", int(value) - 1, g.DIGITS
    elif form == 1:
        shown = list(options)
        if rng.random() < 0.3:  # only some of them, the right one among them
            others = [o for o in shown if o != value]
            keep = int(rng.integers(1, len(others) + 1))
            chosen = {value, *(others[int(i)] for i in rng.permutation(len(others))[:keep])}
            shown = [o for o in shown if o in chosen]
        if shuffled and rng.random() < shuffled:
            shown = [shown[int(i)] for i in rng.permutation(len(shown))]
        said = [str(rng.choice(words[o])) if rng.random() < 0.3 else o for o in shown]
        option, between = str(rng.choice(OPTION_FORMS)), str(rng.choice(OPTION_JOINS))
        listed = between.join(option.format(l="abcdefgh"[i], o=o) for i, o in enumerate(said))
        asked = str(rng.choice(DECODER_WHICH)).format(a=name, A=_capital(name), n=noun)
        text, choices, answer, group = f"{asked} {listed}. Answer: ", "abcdefgh"[: len(shown)], shown.index(value), g.LETTERS
    else:
        truth = bool(rng.integers(0, 2))
        asked_value = value if truth else str(rng.choice([o for o in options if o != value]))
        template = str(rng.choice(DECODER_ASK[attribute]))
        v = str(rng.choice(words[asked_value]))
        if "{v}s" in template and v.endswith("x"):
            template = template.replace("{v}s", "{v}es")
        if template.startswith("{v}"):
            v = _capital(v)
        if attribute == "count" and "{n}" in template:
            template = template.replace("{n}", plural_of(noun) if m.attributes[2] == "1" else noun)
        if m.modality == "image" and m.attributes[2] != "1":  # "are the boxes …", not "is the boxes …"
            template = template.replace("Is the {n}", "Are the {n}")
        text = template.format(v=v, n=noun).replace(" a a", " an a").replace(" a o", " an o")
        text, choices, answer, group = f"{text} Answer y or n: ", "yn", 0 if truth else 1, g.YES_NO
    text = text[0].lower() + text[1:] if lead.endswith(", ") else text
    return g.Question(f"{caption}{join}{lead}{text}", choices, answer, group)
