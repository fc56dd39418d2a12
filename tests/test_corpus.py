import re

from lmtune.data.corpus import stories, words


def test_same_seed_gives_identical_bytes_and_other_seed_differs(tmp_path):
    a = stories.write_corpus(tmp_path / "a.txt", target_bytes=50_000, seed=3).read_bytes()
    b = stories.write_corpus(tmp_path / "b.txt", target_bytes=50_000, seed=3).read_bytes()
    c = stories.write_corpus(tmp_path / "c.txt", target_bytes=50_000, seed=4).read_bytes()
    assert a == b
    assert a != c


def test_generate_stories_is_deterministic():
    assert list(stories.generate_stories(20, seed=7)) == list(stories.generate_stories(20, seed=7))


def test_default_size_corpus_is_close_to_its_target_size(tmp_path):
    path = stories.write_corpus(tmp_path / "s.txt", target_bytes=4_000_000)
    size = path.stat().st_size
    assert 4_000_000 <= size < 4_010_000


def test_vocabulary_has_a_few_thousand_distinct_words(tmp_path):
    text = stories.write_corpus(tmp_path / "s.txt", target_bytes=4_000_000).read_text()
    words = set(re.findall(r"[a-z]+", text.lower()))
    assert 1500 <= len(words) <= 10_000


def test_documents_are_separated_by_endoftext_lines(tmp_path):
    text = stories.write_corpus(tmp_path / "s.txt", target_bytes=20_000).read_text()
    docs = text.split(f"\n{stories.EOT_LINE}\n")
    assert docs[-1] == ""
    assert all(d.strip() and stories.EOT_LINE not in d for d in docs[:-1])


def test_stories_have_a_beginning_and_an_ending():
    openers = ("Once upon a time", "One day", "Long ago", "One sunny morning", "One rainy day", "Once,",
               "One evening", "In a little town", "Not long ago", "One cold winter day")
    for story in stories.generate_stories(200, seed=1):
        assert story.startswith(openers)
        assert story.rstrip().endswith((".", '"', "!"))
        sentences = re.findall(r"[.!?]", story)
        assert 5 <= len(sentences)


def test_a_story_keeps_its_heros_pronoun():
    checked = 0
    for story in stories.generate_stories(300, seed=2):
        m = re.search(r"(?:named|called) (\w+)", story.split("\n")[0])
        if not m:
            continue
        name, wrong = m.group(1), ("his" if m.group(1) in words.GIRLS else "her")
        assert f"{name} bumped {wrong} " not in story and f"{name} put on {wrong} " not in story
        checked += 1
    assert checked > 50
