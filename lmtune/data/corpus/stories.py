"""Built-in synthetic corpus: seeded, deterministic children's stories in the spirit of TinyStories.

The point is a corpus that needs no download yet is rich enough that a small LM keeps improving for
millions of tokens: a vocabulary of a few thousand words (``words``: word lists with inflections built
by rule), dozens of recurring characters, and stories composed at random from many sentence templates,
with a consistent hero, friend and pronouns inside each story.

Documents are separated by a line that contains exactly ``<|endoftext|>`` (``lmtune.prepare`` splits
on it).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from lmtune.data.corpus.words import (
    ACTIVITIES,
    ADJECTIVES,
    ADVERBS,
    ALL_ANIMALS,
    BODY,
    BOYS,
    CLOTHES,
    COLORS,
    FEELINGS,
    FOODS,
    GIRLS,
    HOUSEHOLD,
    MORE_ADJECTIVES,
    MORE_VERBS,
    MOTION_VERBS,
    NATURE,
    OBJECT_VERBS,
    PEOPLE,
    PLACES,
    PLANTS,
    SIZES,
    THINGS,
    TOYS,
    VEHICLES,
    WEATHER,
    a_or_an,
    ing,
    past,
    plural,
    third,
)
from lmtune.data.datadir import open_new, write_all

log = logging.getLogger(__name__)

# Bump whenever the generated text changes, so cached prepared corpora are rebuilt.
GENERATOR_VERSION = 1
EOT_LINE = "<|endoftext|>"


class _Story:
    """One story's cast and state, so that names and pronouns stay consistent throughout."""

    def __init__(self, rng: random.Random):
        self.r = rng
        girl = rng.random() < 0.5
        self.name = rng.choice(GIRLS if girl else BOYS)
        self.he, self.him, self.his = ("she", "her", "her") if girl else ("he", "him", "his")
        self.kind = rng.choice(("girl", "boy")) if rng.random() < 0.5 else rng.choice(ALL_ANIMALS)
        if self.kind in ("girl", "boy"):
            self.kind = "girl" if girl else "boy"
        fgirl = rng.random() < 0.5
        pool = [n for n in (GIRLS if fgirl else BOYS) if n != self.name]
        self.friend = rng.choice(pool)
        self.fhe, self.fhim, self.fhis = ("she", "her", "her") if fgirl else ("he", "him", "his")
        self.fkind = rng.choice(ALL_ANIMALS) if rng.random() < 0.6 else ("girl" if fgirl else "boy")
        self.helper = rng.choice(PEOPLE)
        self.place = rng.choice(PLACES)
        self.place2 = rng.choice(PLACES)
        self.thing = rng.choice(TOYS)
        self.thing_adj = rng.choice(COLORS + SIZES)
        self.food = rng.choice(FOODS)
        self.animal = rng.choice(ALL_ANIMALS)
        self.mentioned_friend = False

    def c(self, seq):
        return self.r.choice(seq)

    def adj(self) -> str:
        return self.c(ADJECTIVES)

    def thing_np(self) -> str:
        return f"{self.thing_adj} {self.thing}"


def _opening(s: _Story) -> str:
    r = s.r
    opener = s.c(("Once upon a time,", "One day,", "Long ago,", "One sunny morning,", "One rainy day,",
                  "Once,", "One evening,", "In a little town,", "Not long ago,", "One cold winter day,"))
    forms = (
        f"{opener} there was {a_or_an(s.adj())} {s.kind} named {s.name}.",
        f"{opener} {a_or_an(s.adj())} {s.kind} called {s.name} lived near the {s.place}.",
        f"{opener} {s.name} the {s.kind} went to the {s.place}.",
        f"{opener} {s.name} woke up and felt very {s.c(FEELINGS)}.",
        f"{opener} {s.name} found {a_or_an(s.thing_np())} in the {s.place}.",
    )
    first = r.choice(forms)
    second = s.c((
        f"{s.name} loved to {s.c(ACTIVITIES)} and {s.c(ACTIVITIES)} every day.",
        f"{s.he.capitalize()} had {a_or_an(s.thing_np())} that {s.he} liked very much.",
        f"{s.he.capitalize()} was {s.adj()} and {s.adj()}.",
        f"Every morning, {s.name} liked to {s.c(MOTION_VERBS)} to the {s.place2}.",
        f"{s.name} lived with {s.his} {s.helper} in {a_or_an(s.adj())} house.",
    ))
    return f"{first} {second}"


def _middle(s: _Story) -> str:
    r = s.r
    verb = s.c(OBJECT_VERBS)
    mv = s.c(MOTION_VERBS)
    act = s.c(ACTIVITIES)
    feeling = s.c(FEELINGS)
    adv = s.c(ADVERBS)
    if not s.mentioned_friend and r.random() < 0.6:
        s.mentioned_friend = True
        return s.c((
            f"{s.name} had a friend named {s.friend}. {s.friend} was {a_or_an(s.adj())} {s.fkind}.",
            f"At the {s.place}, {s.name} met {a_or_an(s.fkind)} named {s.friend}.",
            f"Soon, {s.name}'s friend {s.friend} came to {s.c(ACTIVITIES)} with {s.him}.",
        ))
    friend = s.friend if s.mentioned_friend else f"the {s.animal}"
    return r.choice(_sentences(s, verb, mv, act, feeling, adv, friend))()


def _sentences(s: _Story, verb: str, mv: str, act: str, feeling: str, adv: str,
               friend: str) -> tuple[Callable[[], str], ...]:
    """The middle's sentence templates; each draws its own words only when it is the one called."""
    return (
        lambda: f"{s.name} {past(mv)} {adv} to the {s.c(PLACES)}.",
        lambda: f"{s.he.capitalize()} {past(verb)} the {s.adj()} {s.c(THINGS)}.",
        lambda: f"{s.name} saw {a_or_an(s.adj())} {s.c(ALL_ANIMALS)} {ing(s.c(MOTION_VERBS))} by the {s.c(NATURE)}.",
        lambda: f"{s.he.capitalize()} felt {feeling} because {s.he} could not find {s.his} {s.thing}.",
        lambda: f"The {s.c(NATURE)} was {s.adj()}, so {s.name} decided to {act}.",
        lambda: f"\"{s.c(('Look', 'Wow', 'Oh no', 'Hello', 'Yay', 'Help', 'Come here'))}!\" said {s.name}. "
        f"\"{s.c(('I want to', 'Can we', 'Let us', 'I like to', 'I can'))} {s.c(ACTIVITIES)}!\"",
        lambda: f"{friend.capitalize() if friend[0].islower() else friend} asked, \"Why are you so {feeling}, "
        f"{s.name}?\"",
        lambda: f"\"Can I {verb} your {s.thing}?\" asked {friend}. {s.name} said, "
        f"\"{s.c(('Yes, you can', 'Not now', 'Maybe later', 'Of course', 'Only if you are careful'))}.\"",
        lambda: f"{s.name} and {friend} {past(act)} together in the {s.c(PLACES)}.",
        lambda: f"Then {s.he} {past(s.c(OBJECT_VERBS))} {a_or_an(s.adj())} {s.c(FOODS)} and ate it {adv}.",
        lambda: f"It started to {s.c(('rain', 'snow', 'get dark', 'get windy', 'get cold'))}, "
        f"so {s.name} {past(s.c(MOTION_VERBS))} home.",
        lambda: f"The {s.c(ALL_ANIMALS)} {past(s.c(ACTIVITIES))} {adv} because it was {s.c(FEELINGS)}.",
        lambda: f"{s.his.capitalize()} {s.helper} said, \"You should {s.c(OBJECT_VERBS)} the "
        f"{s.c(THINGS)} before you {s.c(ACTIVITIES)}.\"",
        lambda: f"Suddenly, the {s.thing} "
        f"{s.c(('fell into the', 'rolled under the', 'flew over the', 'got stuck in the'))} {s.c(NATURE)}.",
        lambda: f"{s.name} {past(s.c(('try', 'want', 'need', 'hope', 'plan')))} to {s.c(OBJECT_VERBS)} "
        f"{a_or_an(s.adj())} {s.c(THINGS)} for {s.his} {s.helper}.",
        lambda: f"{s.he.capitalize()} was {ing(act)} when {s.he} heard {a_or_an(s.adj())} noise.",
        lambda: f"There were many {plural(s.c(THINGS))} and {plural(s.c(THINGS))} at the {s.c(PLACES)}.",
        lambda: f"{s.name} wanted to {s.c(OBJECT_VERBS)} the {plural(s.c(THINGS))}, but {s.he} was too "
        f"{s.c(('small', 'tired', 'scared', 'busy', 'slow', 'short'))}.",
        lambda: f"\"I {s.c(('love', 'like', 'need', 'want', 'found'))} this {s.adj()} {s.c(THINGS)},\" "
        f"{s.name} {s.c(('said', 'whispered', 'shouted', 'laughed', 'smiled'))}.",
        lambda: f"{friend.capitalize() if friend[0].islower() else friend} {third(s.c(ACTIVITIES))} "
        f"every day, so {s.name} {past(s.c(ACTIVITIES))} too.",
        lambda: f"They {past(s.c(MOTION_VERBS))} past {a_or_an(s.adj())} {s.c(NATURE)} and {a_or_an(s.adj())} "
        f"{s.c(ALL_ANIMALS)}.",
        lambda: f"The {s.c(COLORS)} {s.c(ALL_ANIMALS)} was {ing(s.c(OBJECT_VERBS))} {a_or_an(s.c(THINGS))}.",
        lambda: f"{s.name} bumped {s.his} {s.c(BODY)} on the {s.c(HOUSEHOLD)} "
        f"and {past(s.c(('cry', 'yell', 'laugh', 'sigh')))}.",
        lambda: f"The {s.c(ALL_ANIMALS)} had {a_or_an(s.adj())} {s.c(BODY)} and {a_or_an(s.adj())} {s.c(BODY)}.",
        lambda: f"{s.name} put on {s.his} {s.adj()} {s.c(CLOTHES)} "
        f"because it was {s.c(MORE_ADJECTIVES[10:20])} outside.",
        lambda: f"\"Can we ride the {s.c(VEHICLES)} to the {s.c(PLACES)}?\" {s.name} asked {s.his} {s.helper}.",
        lambda: f"In the {s.c(('spring', 'summer', 'autumn', 'winter'))}, "
        f"{plural(s.c(PLANTS))} grew near the {s.c(PLACES)}.",
        lambda: f"{s.name} {past(s.c(MORE_VERBS))} the {plural(s.c(HOUSEHOLD))} and {past(s.c(MORE_VERBS))} "
        f"the {plural(s.c(CLOTHES))}.",
        lambda: f"{s.he.capitalize()} {past(s.c(OBJECT_VERBS))} {a_or_an(s.adj())} {s.c(THINGS)} so that {friend} "
        f"would not be {s.c(FEELINGS)}.",
        lambda: f"Because the {s.c(WEATHER)} was {s.adj()}, the {plural(s.c(ALL_ANIMALS))} {past(s.c(ACTIVITIES))} "
        f"{s.c(ADVERBS)}.",
    )


def _ending(s: _Story) -> str:
    feeling = s.c(("happy", "proud", "glad", "thankful", "calm", "safe", "cheerful", "excited"))
    resolution = s.c((
        f"In the end, {s.name} found the {s.thing} under the {s.c(NATURE)} and felt {feeling}.",
        f"{s.name} and {s.friend} {past(s.c(ACTIVITIES))} all day and were very {feeling}.",
        f"{s.name} said sorry, and {s.friend} gave {s.him} a big hug.",
        f"After that, {s.name} went home and had {a_or_an(s.c(FOODS))} with {s.his} {s.helper}.",
        f"That night, {s.name} {past(s.c(('sleep', 'dream', 'rest', 'smile')))} and felt {feeling}.",
        f"The {s.thing} was fixed, so {s.name} could {s.c(ACTIVITIES)} again.",
    ))
    moral = s.c((
        f"{s.name} learned that it is good to "
        f"{s.c(('share', 'be kind', 'help others', 'say sorry', 'be brave', 'tell the truth', 'listen'))}.",
        "From that day on, they were best friends.",
        f"{s.name} learned that friends make everything better.",
        "And they all lived happily ever after.",
        f"The moral of the story is to always "
        f"{s.c(('be kind', 'share', 'be careful', 'try again', 'be honest', 'help a friend'))}.",
        "The end.",
        f"{s.name} never forgot that {s.adj()} day at the {s.place}.",
    ))
    return f"{resolution} {moral}"


def generate_story(rng: random.Random) -> str:
    s = _Story(rng)
    parts = [_opening(s)]
    n_middle = rng.randint(3, 13)  # opening (2) + middle + ending (2): 5..17 sentences
    para: list[str] = []
    for _ in range(n_middle):
        para.append(_middle(s))
        if rng.random() < 0.25:  # paragraph breaks give the LM some document structure
            parts.append(" ".join(para))
            para = []
    if para:
        parts.append(" ".join(para))
    parts.append(_ending(s))
    return "\n\n".join(parts)


def generate_stories(num_stories: int, seed: int = 0) -> Iterator[str]:
    """Yield ``num_stories`` stories; the same seed always gives the same stories."""
    rng = random.Random(seed)
    for _ in range(num_stories):
        yield generate_story(rng)


def write_corpus(path: Path, target_bytes: int = 4_000_000, seed: int = 0) -> Path:
    """Write stories until at least ``target_bytes`` bytes; each is followed by a ``<|endoftext|>`` line.

    Written to a temp file and renamed, so a crash never leaves a truncated corpus behind; the temp file is removed
    when the writing fails (a full disk raises OSError(ENOSPC) naming ``path``'s temp file) or is interrupted.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    t0 = time.perf_counter()
    rng = random.Random(seed)
    written = 0
    stories = 0
    try:
        with open_new(tmp) as f:
            buf: list[str] = []
            while written < target_bytes:
                doc = f"{generate_story(rng)}\n{EOT_LINE}\n"
                buf.append(doc)
                written += len(doc.encode("utf-8"))
                stories += 1
                if len(buf) >= 512:
                    write_all(f, "".join(buf).encode("utf-8"))
                    buf = []
            write_all(f, "".join(buf).encode("utf-8"))
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)
    log.info("wrote %d stories (%d bytes) to %s in %.1fs", stories, written, path, time.perf_counter() - t0)
    return path
