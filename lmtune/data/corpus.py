"""Built-in synthetic corpus: seeded, deterministic children's stories in the spirit of TinyStories.

The point is a corpus that needs no download yet is rich enough that a small LM keeps improving for
millions of tokens: a vocabulary of a few thousand words (word lists with inflections built by rule),
dozens of recurring characters, and stories composed at random from many sentence templates, with a
consistent hero, friend and pronouns inside each story.

Documents are separated by a line that contains exactly ``<|endoftext|>`` (``lmtune.prepare`` splits
on it). Only lists and tuples are iterated, never sets, so output does not depend on PYTHONHASHSEED.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

# Bump whenever the generated text changes, so cached prepared corpora are rebuilt.
GENERATOR_VERSION = 1
EOT_LINE = "<|endoftext|>"

# --------------------------------------------------------------------------- word lists

GIRLS = (
    "Lily Mia Sue Anna Emma Lucy Ella Zoe Amy Rose Ruby Maya Sara Nora Chloe Grace Daisy Molly Kate Jane "
    "Ivy Luna Hannah Alice Olivia Sophie Bella Clara Ellie Jenny Tina Poppy Hazel Iris Fiona"
).split()
BOYS = (
    "Tom Ben Max Sam Tim Jack Leo Finn Jake Luke Noah Oliver Henry Adam Billy Joe Peter Dan Alex Charlie "
    "Oscar Toby Milo Theo Ryan Eli Owen Kevin Mark Paul Hugo Arlo Ned Ray Zack"
).split()
ANIMALS = (
    "cat dog bunny bird duck frog fox bear mouse puppy kitten lion tiger monkey elephant horse cow pig "
    "sheep goat owl turtle fish squirrel deer wolf chicken hen rabbit giraffe zebra panda koala penguin "
    "dolphin whale seal butterfly bee ant snail spider ladybug dragon unicorn dinosaur hedgehog raccoon "
    "beaver otter camel kangaroo parrot robin crow swan goose lamb pony donkey bat crab octopus shark"
).split()
PEOPLE = (
    "mom dad grandma grandpa teacher friend neighbor baker farmer doctor king queen prince princess "
    "sister brother aunt uncle cousin pilot sailor captain nurse chef painter"
).split()
TOYS = (
    "ball doll kite teddy bear truck car train boat block puzzle drum whistle robot balloon yo-yo top "
    "jump rope toy plane wagon marble crayon book hat scarf shoe sock cup spoon bowl box basket bucket "
    "shovel key lamp clock bell ribbon button coin stone shell feather leaf flower stick map letter "
    "necklace ring crown wand sword shield blanket pillow bag backpack umbrella jar bottle mirror brush "
    "pencil paper picture card candle rope net ladder swing slide bike helmet sled"
).split()
# Two-word toys above were split; rebuild the few that matter as single items.
TOYS = tuple(t for t in TOYS if t not in ("teddy", "jump", "toy")) + ("teddy bear", "jump rope", "toy plane")
FOODS = (
    "apple banana cookie cake pie bread cheese soup carrot pear grape cherry orange lemon berry "
    "strawberry sandwich candy muffin pancake waffle honey jam egg rice noodle pizza corn pea bean "
    "potato tomato melon peach plum nut seed cracker pumpkin cupcake lollipop milk juice tea icecream"
).split()
PLACES = (
    "park garden forest beach river lake pond hill mountain farm town city village school house room "
    "kitchen yard field meadow jungle cave castle island zoo shop store market library playground "
    "bakery barn tree house attic basement street bridge sea desert valley nest tent camp"
).split()
PLACES = tuple(p for p in PLACES if p not in ("tree",)) + ("tree house",)
NATURE = (
    "sun moon star cloud rain snow wind sky tree grass rock water sand wave hill puddle rainbow storm "
    "mud branch root bush pond stream road path fence gate door window roof wall floor table chair bed"
).split()
HOUSEHOLD = (
    "sofa couch rug carpet curtain shelf drawer closet cupboard oven stove fridge sink tub towel soap "
    "fork knife plate pan pot kettle teapot mug glass jug tray napkin broom mop bucket hammer nail "
    "screw saw rake hose fan heater radio phone computer television clock vase frame album diary "
    "notebook envelope stamp sticker glue tape scissors ruler eraser marker chalk paintbrush easel "
    "piano guitar violin flute trumpet harp tambourine xylophone banjo horn rattle"
).split()
CLOTHES = (
    "coat jacket sweater shirt skirt dress pants shorts boot sandal slipper glove mitten cap bonnet "
    "apron belt vest cape mask costume pajamas raincoat tie bow badge watch bracelet"
).split()
BODY = (
    "head hand foot arm leg nose ear eye mouth tooth tail wing paw fur beak whisker knee elbow finger "
    "toe cheek chin neck shoulder tummy back hair"
).split()
VEHICLES = (
    "bus van taxi rocket ship tractor scooter skateboard wheelbarrow cart canoe raft submarine "
    "helicopter airplane truck ambulance"
).split()
PLANTS = (
    "rose daisy tulip sunflower lily daffodil violet clover mushroom acorn pinecone vine cactus fern "
    "oak maple pine willow palm seedling sprout weed moss hedge petal"
).split()
CRITTERS = (
    "worm beetle caterpillar dragonfly firefly grasshopper cricket moth mosquito fly wasp tadpole "
    "lizard snake toad slug starfish jellyfish seahorse lobster shrimp clam oyster puffin flamingo "
    "peacock ostrich eagle hawk pigeon sparrow woodpecker hummingbird canary chick duckling piglet calf "
    "foal cub bunny kitten gorilla chimpanzee rhino hippo cheetah leopard jaguar moose bison buffalo "
    "walrus mole badger weasel skunk chipmunk hamster gerbil ferret llama alpaca"
).split()
WEATHER = (
    "breeze fog mist thunder lightning hail frost ice icicle snowflake snowman raindrop sunshine "
    "sunset sunrise shadow dawn dusk noon midnight season spring summer autumn winter"
).split()
MORE_ADJECTIVES = (
    "little fuzzy prickly slippery squishy crunchy juicy crispy creamy frosty foggy rainy sunny windy "
    "snowy stormy cloudy muddy sandy rocky grassy leafy dusty rusty crooked straight curly wavy "
    "spiky silky woolly golden wooden metal plastic glass paper striped dotted spotted twinkly "
    "glittery glowing sleepy dreamy jolly merry gloomy eager anxious cautious daring fearless "
    "generous greedy selfish patient impatient stubborn bossy cheeky clumsy graceful nimble mighty "
    "puny enormous miniature gigantic ancient modern famous ordinary unusual magical mysterious "
    "peaceful noisy gentle fierce wobbly bouncy rubbery chewy sugary spicy bitter fresh stale ripe "
    "rotten smelly fragrant tasty delicious awful terrible marvelous fantastic splendid gorgeous "
    "adorable charming tiny itsy cuddly snuggly huggy warmhearted kindhearted"
).split()
MORE_VERBS = (
    "bounce wiggle giggle tumble stumble sneak peek peep scramble splash sprinkle scribble tickle "
    "squeeze sniff lick chew nibble munch gobble sip pour stir mix chop slice spread decorate "
    "measure weigh sort gather collect pack unpack knock ring shout yell cheer hum whistle juggle "
    "balance wobble paddle row steer float sink glide soar flutter buzz chirp bark purr roar quack "
    "moo oink neigh hiss howl growl squeak croak tweet snore cuddle snuggle comfort rescue protect "
    "warn invite welcome forgive remember forget notice wonder imagine discover explore invent "
    "repair tidy scrub dust rinse dry iron sew knit stitch glue cut tape"
).split()
COLORS = "red blue green yellow pink purple orange brown black white gray gold silver".split()
SIZES = "big small little tiny huge tall short long round fat thin giant".split()
QUALITIES = (
    "happy sad angry scared brave kind nice mean silly funny shy proud tired sleepy hungry thirsty "
    "curious gentle quiet loud soft hard warm cold hot wet dry clean dirty shiny dark bright old new "
    "young fast slow strong weak smart clever wise lazy busy calm wild good bad pretty ugly beautiful "
    "lovely friendly lonely grumpy cheerful careful careless playful helpful hopeful thankful "
    "colorful wonderful special strange fancy plain sweet sour salty yummy fluffy fuzzy smooth rough "
    "sticky stinky noisy cozy bumpy sparkly spotty stripy messy tidy heavy light empty full deep "
    "high low rich poor lucky polite rude honest brave bold neat odd magic secret hidden lost broken "
    "open closed"
).split()
FEELINGS = (
    "happy sad angry scared proud excited worried surprised lonely glad upset nervous calm sorry "
    "jealous grateful amazed curious bored cheerful hopeful shy brave safe"
).split()
# Adverbs derived by rule from these adjectives ("quick" -> "quickly", "happy" -> "happily").
ADVERB_BASES = (
    "quick slow happy sad loud quiet soft gentle careful brave kind proud calm sweet sudden slow "
    "busy lazy angry eager polite neat silly quick bright warm wild proper nervous patient final "
    "honest polite rough smooth tight loose brief sleepy hungry shy"
).split()

# Verbs: (base, past). Regular past tenses are derived by rule; irregular ones are listed.
IRREGULAR = {
    "run": "ran", "see": "saw", "go": "went", "come": "came", "eat": "ate", "drink": "drank",
    "find": "found", "give": "gave", "take": "took", "make": "made", "sing": "sang", "swim": "swam",
    "fly": "flew", "draw": "drew", "throw": "threw", "catch": "caught", "buy": "bought",
    "bring": "brought", "think": "thought", "feel": "felt", "hold": "held", "keep": "kept",
    "sleep": "slept", "sit": "sat", "stand": "stood", "tell": "told", "say": "said", "hear": "heard",
    "build": "built", "dig": "dug", "hide": "hid", "ride": "rode", "write": "wrote", "read": "read",
    "break": "broke", "wake": "woke", "lose": "lost", "win": "won", "get": "got", "know": "knew",
    "grow": "grew", "blow": "blew", "fall": "fell", "leave": "left", "meet": "met", "shake": "shook",
    "bake": "baked", "creep": "crept", "sink": "sank", "sew": "sewed", "cut": "cut",
    "forget": "forgot", "forgive": "forgave",
    "spin": "spun", "sweep": "swept", "feed": "fed", "begin": "began", "bite": "bit",
    "climb": "climbed", "wear": "wore", "tear": "tore", "steal": "stole", "teach": "taught",
    "send": "sent", "spend": "spent", "lend": "lent", "sell": "sold", "light": "lit", "shine": "shone",
    "slide": "slid", "swing": "swung", "stick": "stuck", "hang": "hung", "ring": "rang", "drive": "drove",
}
DOUBLE = tuple(
    "hop skip clap hug drop nap plan grab shop wrap jog chat pat tap trip rub stop nod hum bob sip chop knit "
    "scrub stir".split()
)
MOTION_VERBS = (
    "run walk hop skip jump dance march race stroll wander climb crawl swim fly roll slide rush hurry "
    "jog tiptoe zoom dash float sail ride drive spin bounce creep stomp waddle gallop"
).split()
OBJECT_VERBS = (
    "find see take hold catch throw kick push pull carry hug kiss pick grab wash clean paint draw "
    "fix build break hide share give lose keep open close fill empty drop lift shake touch smell "
    "watch love like want need use borrow trade mend fold wrap bring buy sell color polish count "
    "stack toss bounce roll dig plant water chase follow help visit call thank greet tickle feed"
).split()
ACTIVITIES = (
    "play sing read laugh smile cry shout whisper nap sleep rest cook bake swim dance paint draw "
    "write listen learn think dream wait look search hum giggle clap cheer wave sigh yawn sneeze "
    "pray wish explore practice count pretend rhyme whistle"
).split()


def _past(verb: str) -> str:
    if verb in IRREGULAR:
        return IRREGULAR[verb]
    if verb in DOUBLE:
        return verb + verb[-1] + "ed"
    if verb.endswith("e"):
        return verb + "d"
    if verb.endswith("y") and verb[-2] not in "aeiou":
        return verb[:-1] + "ied"
    return verb + "ed"


def _ing(verb: str) -> str:
    if verb in DOUBLE or verb in ("run", "swim", "sit", "dig", "win", "begin", "spin", "get"):
        return verb + verb[-1] + "ing"
    if verb.endswith("ie"):
        return verb[:-2] + "ying"
    if verb.endswith("e") and not verb.endswith(("ee", "oe")):
        return verb[:-1] + "ing"
    return verb + "ing"


def _third(verb: str) -> str:
    if verb in ("go", "do"):
        return verb + "es"
    if verb.endswith(("s", "sh", "ch", "x", "z")):
        return verb + "es"
    if verb.endswith("y") and verb[-2] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


def _plural(noun: str) -> str:
    head, _, last = noun.rpartition(" ")
    irregular = {"mouse": "mice", "sheep": "sheep", "fish": "fish", "deer": "deer", "goose": "geese",
                 "leaf": "leaves", "wolf": "wolves", "shelf": "shelves", "knife": "knives"}
    if last in irregular:
        p = irregular[last]
    elif last.endswith(("s", "sh", "ch", "x", "z")):
        p = last + "es"
    elif last.endswith("y") and last[-2] not in "aeiou":
        p = last[:-1] + "ies"
    elif last in ("potato", "tomato"):
        p = last + "es"
    else:
        p = last + "s"
    return f"{head} {p}" if head else p


def _adverb(adj: str) -> str:
    if adj.endswith("y") and adj not in ("shy",):
        return adj[:-1] + "ily"
    if adj.endswith("le"):
        return adj[:-1] + "y"
    return adj + "ly"


ADVERBS = tuple(dict.fromkeys(_adverb(a) for a in ADVERB_BASES))
ADJECTIVES = tuple(dict.fromkeys(COLORS + SIZES + QUALITIES + MORE_ADJECTIVES))
THINGS = tuple(dict.fromkeys(TOYS + tuple(FOODS + NATURE + HOUSEHOLD + CLOTHES + VEHICLES + PLANTS + WEATHER)))
ALL_ANIMALS = tuple(dict.fromkeys(ANIMALS + CRITTERS))
OBJECT_VERBS = tuple(dict.fromkeys(OBJECT_VERBS + MORE_VERBS[:60]))
ACTIVITIES = tuple(dict.fromkeys(ACTIVITIES + MORE_VERBS[60:]))


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def vocabulary() -> list[str]:
    """All word forms the generator can emit from its lists (for docs and tests)."""
    words: list[str] = []
    for n in ALL_ANIMALS + tuple(PEOPLE) + THINGS + tuple(PLACES) + tuple(BODY):
        words += [n, _plural(n)]
    for v in dict.fromkeys(tuple(MOTION_VERBS) + OBJECT_VERBS + ACTIVITIES + tuple(MORE_VERBS)):
        words += [v, _past(v), _ing(v), _third(v)]
    words += list(ADJECTIVES) + list(ADVERBS) + list(GIRLS) + list(BOYS)
    return sorted({w.lower() for phrase in words for w in phrase.split()})


# --------------------------------------------------------------------------- story composition


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
        f"{opener} there was {_a(s.adj())} {s.kind} named {s.name}.",
        f"{opener} {_a(s.adj())} {s.kind} called {s.name} lived near the {s.place}.",
        f"{opener} {s.name} the {s.kind} went to the {s.place}.",
        f"{opener} {s.name} woke up and felt very {s.c(FEELINGS)}.",
        f"{opener} {s.name} found {_a(s.thing_np())} in the {s.place}.",
    )
    first = r.choice(forms)
    second = s.c((
        f"{s.name} loved to {s.c(ACTIVITIES)} and {s.c(ACTIVITIES)} every day.",
        f"{s.he.capitalize()} had {_a(s.thing_np())} that {s.he} liked very much.",
        f"{s.he.capitalize()} was {s.adj()} and {s.adj()}.",
        f"Every morning, {s.name} liked to {s.c(MOTION_VERBS)} to the {s.place2}.",
        f"{s.name} lived with {s.his} {s.helper} in {_a(s.adj())} house.",
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
            f"{s.name} had a friend named {s.friend}. {s.friend} was {_a(s.adj())} {s.fkind}.",
            f"At the {s.place}, {s.name} met {_a(s.fkind)} named {s.friend}.",
            f"Soon, {s.name}'s friend {s.friend} came to {s.c(ACTIVITIES)} with {s.him}.",
        ))
    friend = s.friend if s.mentioned_friend else f"the {s.animal}"
    templates = (
        lambda: f"{s.name} {_past(mv)} {adv} to the {s.c(PLACES)}.",
        lambda: f"{s.he.capitalize()} {_past(verb)} the {s.adj()} {s.c(THINGS)}.",
        lambda: f"{s.name} saw {_a(s.adj())} {s.c(ALL_ANIMALS)} {_ing(s.c(MOTION_VERBS))} by the {s.c(NATURE)}.",
        lambda: f"{s.he.capitalize()} felt {feeling} because {s.he} could not find {s.his} {s.thing}.",
        lambda: f"The {s.c(NATURE)} was {s.adj()}, so {s.name} decided to {act}.",
        lambda: f"\"{s.c(('Look', 'Wow', 'Oh no', 'Hello', 'Yay', 'Help', 'Come here'))}!\" said {s.name}. "
        f"\"{s.c(('I want to', 'Can we', 'Let us', 'I like to', 'I can'))} {s.c(ACTIVITIES)}!\"",
        lambda: f"{friend.capitalize() if friend[0].islower() else friend} asked, \"Why are you so {feeling}, "
        f"{s.name}?\"",
        lambda: f"\"Can I {verb} your {s.thing}?\" asked {friend}. {s.name} said, "
        f"\"{s.c(('Yes, you can', 'Not now', 'Maybe later', 'Of course', 'Only if you are careful'))}.\"",
        lambda: f"{s.name} and {friend} {_past(act)} together in the {s.c(PLACES)}.",
        lambda: f"Then {s.he} {_past(s.c(OBJECT_VERBS))} {_a(s.adj())} {s.c(FOODS)} and ate it {adv}.",
        lambda: f"It started to {s.c(('rain', 'snow', 'get dark', 'get windy', 'get cold'))}, "
        f"so {s.name} {_past(s.c(MOTION_VERBS))} home.",
        lambda: f"The {s.c(ALL_ANIMALS)} {_past(s.c(ACTIVITIES))} {adv} because it was {s.c(FEELINGS)}.",
        lambda: f"{s.his.capitalize()} {s.helper} said, \"You should {s.c(OBJECT_VERBS)} the "
        f"{s.c(THINGS)} before you {s.c(ACTIVITIES)}.\"",
        lambda: f"Suddenly, the {s.thing} "
        f"{s.c(('fell into the', 'rolled under the', 'flew over the', 'got stuck in the'))} {s.c(NATURE)}.",
        lambda: f"{s.name} {_past(s.c(('try', 'want', 'need', 'hope', 'plan')))} to {s.c(OBJECT_VERBS)} "
        f"{_a(s.adj())} {s.c(THINGS)} for {s.his} {s.helper}.",
        lambda: f"{s.he.capitalize()} was {_ing(act)} when {s.he} heard {_a(s.adj())} noise.",
        lambda: f"There were many {_plural(s.c(THINGS))} and {_plural(s.c(THINGS))} at the {s.c(PLACES)}.",
        lambda: f"{s.name} wanted to {s.c(OBJECT_VERBS)} the {_plural(s.c(THINGS))}, but {s.he} was too "
        f"{s.c(('small', 'tired', 'scared', 'busy', 'slow', 'short'))}.",
        lambda: f"\"I {s.c(('love', 'like', 'need', 'want', 'found'))} this {s.adj()} {s.c(THINGS)},\" "
        f"{s.name} {s.c(('said', 'whispered', 'shouted', 'laughed', 'smiled'))}.",
        lambda: f"{friend.capitalize() if friend[0].islower() else friend} {_third(s.c(ACTIVITIES))} "
        f"every day, so {s.name} {_past(s.c(ACTIVITIES))} too.",
        lambda: f"They {_past(s.c(MOTION_VERBS))} past {_a(s.adj())} {s.c(NATURE)} and {_a(s.adj())} "
        f"{s.c(ALL_ANIMALS)}.",
        lambda: f"The {s.c(COLORS)} {s.c(ALL_ANIMALS)} was {_ing(s.c(OBJECT_VERBS))} {_a(s.c(THINGS))}.",
        lambda: f"{s.name} bumped {s.his} {s.c(BODY)} on the {s.c(HOUSEHOLD)} "
        f"and {_past(s.c(('cry', 'yell', 'laugh', 'sigh')))}.",
        lambda: f"The {s.c(ALL_ANIMALS)} had {_a(s.adj())} {s.c(BODY)} and {_a(s.adj())} {s.c(BODY)}.",
        lambda: f"{s.name} put on {s.his} {s.adj()} {s.c(CLOTHES)} "
        f"because it was {s.c(MORE_ADJECTIVES[10:20])} outside.",
        lambda: f"\"Can we ride the {s.c(VEHICLES)} to the {s.c(PLACES)}?\" {s.name} asked {s.his} {s.helper}.",
        lambda: f"In the {s.c(('spring', 'summer', 'autumn', 'winter'))}, "
        f"{_plural(s.c(PLANTS))} grew near the {s.c(PLACES)}.",
        lambda: f"{s.name} {_past(s.c(MORE_VERBS))} the {_plural(s.c(HOUSEHOLD))} and {_past(s.c(MORE_VERBS))} "
        f"the {_plural(s.c(CLOTHES))}.",
        lambda: f"{s.he.capitalize()} {_past(s.c(OBJECT_VERBS))} {_a(s.adj())} {s.c(THINGS)} so that {friend} "
        f"would not be {s.c(FEELINGS)}.",
        lambda: f"Because the {s.c(WEATHER)} was {s.adj()}, the {_plural(s.c(ALL_ANIMALS))} {_past(s.c(ACTIVITIES))} "
        f"{s.c(ADVERBS)}.",
    )
    return r.choice(templates)()


def _ending(s: _Story) -> str:
    feeling = s.c(("happy", "proud", "glad", "thankful", "calm", "safe", "cheerful", "excited"))
    resolution = s.c((
        f"In the end, {s.name} found the {s.thing} under the {s.c(NATURE)} and felt {feeling}.",
        f"{s.name} and {s.friend} {_past(s.c(ACTIVITIES))} all day and were very {feeling}.",
        f"{s.name} said sorry, and {s.friend} gave {s.him} a big hug.",
        f"After that, {s.name} went home and had {_a(s.c(FOODS))} with {s.his} {s.helper}.",
        f"That night, {s.name} {_past(s.c(('sleep', 'dream', 'rest', 'smile')))} and felt {feeling}.",
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

    Written to a temp file and renamed, so a crash never leaves a truncated corpus behind.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    t0 = time.perf_counter()
    rng = random.Random(seed)
    written = 0
    stories = 0
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        buf: list[str] = []
        while written < target_bytes:
            doc = f"{generate_story(rng)}\n{EOT_LINE}\n"
            buf.append(doc)
            written += len(doc.encode("utf-8"))
            stories += 1
            if len(buf) >= 512:
                f.write("".join(buf))
                buf = []
        f.write("".join(buf))
    tmp.replace(path)
    log.info("wrote %d stories (%d bytes) to %s in %.1fs", stories, written, path, time.perf_counter() - t0)
    return path
