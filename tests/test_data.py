import json
import threading
import types

import numpy as np
import pytest
import torch

from lmtune.data import batches, dataset
from lmtune.errors import LmtuneError


def _make_dir(tmp_path, n_train=1000, n_val=200, vocab=50, dtype="uint16"):
    d = tmp_path / "data"
    d.mkdir()
    rng = np.random.default_rng(0)
    train = rng.integers(0, vocab, n_train).astype(dtype)
    val = rng.integers(0, vocab, n_val).astype(dtype)
    train.tofile(d / "train.bin")
    val.tofile(d / "val.bin")
    meta = {"vocab_size": vocab, "dtype": dtype, "train_tokens": n_train, "val_tokens": n_val,
            "max_token_id": int(max(train.max(), val.max())), "eot_id": None, "content_hash": "x",
            "sources": [], "tokenizer": None, "created_by": "lmtune.prepare"}
    (d / "meta.json").write_text(json.dumps(meta))
    return d, train, val


def test_load_data_memory_maps_both_splits(tmp_path):
    d, train, val = _make_dir(tmp_path)
    td = dataset.load_data(d, context_length=16, vocab_size=50)
    assert isinstance(td.train, np.memmap) and np.array_equal(td.train, train)
    assert np.array_equal(td.val, val)
    assert td.meta.vocab_size == 50 and td.meta.dtype == "uint16"


def test_sampler_covers_first_and_last_valid_start_and_never_beyond():
    tokens = np.arange(20, dtype=np.uint16)
    s = batches.BatchSampler(tokens, batch_size=8, context_length=5, seed=0)
    starts = np.concatenate([s.starts(i) for i in range(500)])
    assert starts.min() == 0
    assert starts.max() == 20 - 5 - 1
    assert starts.dtype == np.int64 and starts.shape == (4000,)


def test_targets_are_inputs_shifted_by_one():
    tokens = np.arange(1000, dtype=np.uint16)
    x, y = batches.BatchSampler(tokens, batch_size=4, context_length=8, seed=1).batch(3)
    assert x.shape == y.shape == (4, 8) and x.dtype == y.dtype == torch.int64
    assert torch.equal(y[:, :-1], x[:, 1:])
    assert torch.equal(y[:, -1], x[:, -1] + 1)
    assert x.is_contiguous() and y.is_contiguous()


def test_starts_are_a_pure_function_of_seed_and_step():
    tokens = np.zeros(10_000, dtype=np.uint16)
    a = batches.BatchSampler(tokens, 16, 32, seed=5)
    b = batches.BatchSampler(tokens, 16, 32, seed=5)
    assert np.array_equal(a.starts(7), b.starts(7))
    a.starts(8)  # drawing other steps does not change a step's starts
    assert np.array_equal(a.starts(7), b.starts(7))
    assert not np.array_equal(a.starts(7), a.starts(8))
    assert not np.array_equal(a.starts(7), batches.BatchSampler(tokens, 16, 32, seed=6).starts(7))


def test_device_batches_on_cpu_yield_the_sampler_batches_in_order_from_start_step():
    tokens = np.arange(5000, dtype=np.uint16)
    sampler = batches.BatchSampler(tokens, 4, 16, seed=3)
    with batches.DeviceBatches(sampler, torch.device("cpu"), start_step=10) as prefetched:
        for step in range(10, 20):
            x, y = prefetched.next()
            ex, ey = sampler.batch(step)
            assert torch.equal(x, ex) and torch.equal(y, ey)
    assert not prefetched._thread.is_alive()


def test_last_wait_s_is_how_long_next_waited_for_its_batch_and_zero_when_it_was_waiting(monkeypatch):
    """The wait is read on a stand-in clock that only the producer moves: its first batch takes 2.5 s to build,
    and is built only once next() has started waiting for it; the batch after takes no time."""
    clock = types.SimpleNamespace(now=100.0)
    asked = threading.Event()  # next() has read the clock: the consumer is waiting

    def perf_counter() -> float:
        asked.set()
        return clock.now

    class SlowFirstBatch(batches.BatchSampler):
        def batch(self, step):
            if step == 0:
                asked.wait(timeout=60)
                clock.now += 2.5  # (written before the batch is queued: next() reads it after taking the batch)
            return super().batch(step)

    monkeypatch.setattr(batches, "time", types.SimpleNamespace(perf_counter=perf_counter))
    tokens = np.arange(5000, dtype=np.uint16)
    expected = batches.BatchSampler(tokens, 4, 16, seed=3)
    with batches.DeviceBatches(SlowFirstBatch(tokens, 4, 16, seed=3), torch.device("cpu")) as prefetched:
        x, _ = prefetched.next()
        assert torch.equal(x, expected.batch(0)[0])
        assert prefetched.last_wait_s == 2.5
        x, _ = prefetched.next()
        assert torch.equal(x, expected.batch(1)[0])
        assert prefetched.last_wait_s == 0.0  # this call's wait, not the run's so far


def test_fixed_val_batches_are_deterministic():
    tokens = np.arange(3000, dtype=np.uint16) % 101
    a = batches.fixed_val_batches(tokens, 4, 16, num_batches=3)
    b = batches.fixed_val_batches(tokens, 4, 16, num_batches=3)
    assert len(a) == 3 and all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(a, b, strict=True))


def test_validation_windows_never_overlap_and_spread_over_the_split():
    tokens = np.arange(3000, dtype=np.uint16)  # each token is its own position
    val = batches.fixed_val_batches(tokens, 4, 16, num_batches=3)
    starts = sorted(int(x[0]) for xb, _ in val for x in xb)
    assert len(starts) == 12 and all(b - a >= 16 for a, b in zip(starts, starts[1:], strict=False))
    assert starts[-1] > 2000  # spread over the split, not its first windows
    for x, y in val:
        assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:, -1], x[:, -1] + 1)


def test_a_short_validation_split_is_evaluated_whole_with_a_warning(caplog):
    tokens = np.arange(100, dtype=np.uint16)  # 6 windows of 16: fewer than 3 batches x 4 asked for
    val = batches.fixed_val_batches(tokens, 4, 16, num_batches=3)
    assert [tuple(x.shape) for x, _ in val] == [(4, 16)]
    assert "only 6 non-overlapping windows" in caplog.text and "evaluating on 4" in caplog.text
    tiny = batches.fixed_val_batches(np.arange(40, dtype=np.uint16), 4, 16, num_batches=3)
    assert [tuple(x.shape) for x, _ in tiny] == [(2, 16)]


def test_unigram_entropy_of_uniform_tokens_is_log_vocab():
    tokens = np.tile(np.arange(8, dtype=np.uint16), 100)
    assert dataset.unigram_entropy(tokens, 8) == pytest.approx(np.log(8))
    assert dataset.unigram_entropy(np.zeros(10, dtype=np.uint16), 8) == pytest.approx(0.0)


def test_missing_dir_says_how_to_prepare(tmp_path):
    with pytest.raises(LmtuneError, match=r"nowhere does not exist.*python -m lmtune\.prepare"):
        dataset.load_data(tmp_path / "nowhere", 16)


def test_dir_without_meta_says_how_to_prepare(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(LmtuneError, match=r"meta\.json is missing.*python -m lmtune\.prepare --input FILE --out DIR"):
        dataset.load_data(tmp_path / "d", 16)


def test_missing_bin_says_how_to_prepare(tmp_path):
    d, _, _ = _make_dir(tmp_path)
    (d / "val.bin").unlink()
    with pytest.raises(LmtuneError, match=r"val\.bin is missing.*python -m lmtune\.prepare"):
        dataset.load_data(d, 16)


def test_bin_size_inconsistent_with_meta_is_reported(tmp_path):
    d, _, _ = _make_dir(tmp_path)
    with open(d / "train.bin", "ab") as f:
        f.write(b"\0")
    with pytest.raises(LmtuneError, match=r"train\.bin has 2001 bytes but meta\.json says 1000 uint16 tokens"):
        dataset.load_data(d, 16)


def test_token_ids_beyond_model_vocab_are_reported(tmp_path):
    d, _, _ = _make_dir(tmp_path, vocab=50)
    with pytest.raises(LmtuneError, match=r"set vocab_size >= 50 or re-prepare"):
        dataset.load_data(d, 16, vocab_size=40)


def test_split_shorter_than_context_is_reported(tmp_path):
    d, _, _ = _make_dir(tmp_path, n_val=64)
    dataset.load_data(d, 63)
    with pytest.raises(LmtuneError, match=r"val\.bin has 64 tokens.*use a smaller context_length"):
        dataset.load_data(d, 64)


def test_load_data_reads_a_real_prepared_dir(tmp_path):
    from lmtune.data import prepare
    from lmtune.data.corpus import stories

    src = stories.write_corpus(tmp_path / "s.txt", target_bytes=30_000)
    out = prepare.prepare_text([src], tmp_path / "p", vocab_size=500)
    td = dataset.load_data(out, 32, vocab_size=500)
    assert td.train.shape[0] == td.meta.train_tokens and td.meta.eot_id == 0
