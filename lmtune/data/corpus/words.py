"""The built-in corpus's lexicon: word lists and the rules that inflect them (past tense, -ing, third
person, plural, adverbs, "a"/"an").

Only lists and tuples, never sets, are iterated, so the stories built from them do not depend on
PYTHONHASHSEED. Changing a list changes the corpus: bump ``stories.GENERATOR_VERSION`` with it.
"""

from __future__ import annotations

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


def past(verb: str) -> str:
    if verb in IRREGULAR:
        return IRREGULAR[verb]
    if verb in DOUBLE:
        return verb + verb[-1] + "ed"
    if verb.endswith("e"):
        return verb + "d"
    if verb.endswith("y") and verb[-2] not in "aeiou":
        return verb[:-1] + "ied"
    return verb + "ed"


def ing(verb: str) -> str:
    if verb in DOUBLE or verb in ("run", "swim", "sit", "dig", "win", "begin", "spin", "get"):
        return verb + verb[-1] + "ing"
    if verb.endswith("ie"):
        return verb[:-2] + "ying"
    if verb.endswith("e") and not verb.endswith(("ee", "oe")):
        return verb[:-1] + "ing"
    return verb + "ing"


def third(verb: str) -> str:
    if verb in ("go", "do"):
        return verb + "es"
    if verb.endswith(("s", "sh", "ch", "x", "z")):
        return verb + "es"
    if verb.endswith("y") and verb[-2] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


def plural(noun: str) -> str:
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


def a_or_an(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def vocabulary() -> list[str]:
    """All word forms the generator can emit from its lists (for docs and tests)."""
    words: list[str] = []
    for n in ALL_ANIMALS + tuple(PEOPLE) + THINGS + tuple(PLACES) + tuple(BODY):
        words += [n, plural(n)]
    for v in dict.fromkeys(tuple(MOTION_VERBS) + OBJECT_VERBS + ACTIVITIES + tuple(MORE_VERBS)):
        words += [v, past(v), ing(v), third(v)]
    words += list(ADJECTIVES) + list(ADVERBS) + list(GIRLS) + list(BOYS)
    return sorted({w.lower() for phrase in words for w in phrase.split()})

