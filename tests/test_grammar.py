"""The tutor corpus: vocabulary, tokenizer, splits, the uniqueness of corrections, batches."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from minigpt import grammar


def test_vocabulary_size_is_the_one_the_docstring_states():
    assert grammar.VOCAB_SIZE == len(grammar.vocabulary()) == 609
    stated = re.search(r"\*\*(\d+) tokens in all\*\* \((\d+) words\)", grammar.__doc__)
    assert stated, "the module docstring must state the exact vocabulary size"
    assert (int(stated.group(1)), int(stated.group(2))) == (grammar.VOCAB_SIZE, grammar.VOCAB_SIZE - 4)
    assert grammar.vocabulary()[:4] == grammar.SPECIALS
    assert len(set(grammar.vocabulary())) == grammar.VOCAB_SIZE, "no duplicate tokens"
    lowered = [w.lower() for w in grammar.vocabulary()]
    assert len(set(lowered)) == len(lowered), "case-insensitive lookup must be unambiguous"


def test_encode_decode_round_trip():
    words = " ".join(grammar.vocabulary()[4:])
    assert grammar.decode(grammar.encode(words)) == words
    corpus = grammar.build_corpus()
    for example in corpus["test"][:300] + corpus["train"][:300]:
        for text in (example.wrong, example.right):
            assert grammar.decode(grammar.encode(text)) == text


def test_encode_is_case_insensitive_and_ignores_punctuation():
    assert grammar.encode("Nosotros HABLA Español.") == grammar.encode("nosotros habla español")
    assert grammar.decode(grammar.encode("i speak english")) == "I speak English"


def test_unknown_word_is_named():
    with pytest.raises(grammar.UnknownWordError, match="'chino'"):
        grammar.encode("nosotros hablamos chino")


def test_splits_never_share_a_sentence():
    corpus = grammar.build_corpus()
    sizes = {name: len(examples) for name, examples in corpus.items()}
    assert sizes["val"] > 1000 and sizes["test"] > 1000 and sizes["train"] > 30_000, sizes
    texts = {name: {e.right for e in ex} | {e.wrong for e in ex} for name, ex in corpus.items()}
    assert not texts["train"] & texts["val"]
    assert not texts["train"] & texts["test"]
    assert not texts["val"] & texts["test"]


def test_corpus_is_deterministic_and_seeded():
    fresh = grammar.generate_corpus(0)  # bypass both caches (this process's and the file): generate it again
    assert fresh == grammar.build_corpus(0)  # what every run trains on, read from the cache file when kept
    other = grammar.generate_corpus(1, pool=2000)
    assert [e.right for e in other["train"][:50]] != [e.right for e in fresh["train"][:50]]


@pytest.fixture
def cache_in(tmp_path, monkeypatch):
    """The corpus cache in a folder of this test's, this process's own caches emptied before and after."""

    def clear():
        grammar.build_corpus.cache_clear()
        grammar.tokenized.cache_clear()

    monkeypatch.setenv(grammar.CACHE_VARIABLE, str(tmp_path / "cache"))
    clear()
    yield tmp_path / "cache"
    clear()


def test_the_kept_corpus_is_the_generated_one(cache_in, monkeypatch):
    """The first process generates the corpus and keeps it (the examples, each split's token rows);
    the next reads the files and gets exactly what generating it gives."""
    generated = grammar.generate_corpus(1, pool=2000)
    first = grammar.build_corpus(1, pool=2000)
    assert first == generated
    rows, sep_at = grammar.tokenized("val", 40)  # the default corpus's (seed 0), 41 tokens a row
    made = grammar._tokenize(grammar.generate_corpus(0)["val"], 40)
    assert np.array_equal(rows, made[0]) and np.array_equal(sep_at, made[1])
    kept = sorted(p.name.split("-")[0] + p.suffix for p in cache_in.iterdir())
    assert kept == ["corpus.json", "corpus.json", "tokens.npz"], kept  # seed 1's corpus, seed 0's, its val rows
    grammar.build_corpus.cache_clear()
    grammar.tokenized.cache_clear()
    (cache_in / "unrelated.txt").write_text("x")
    for name in ("generate_corpus", "_tokenize"):  # from here on, only the files can answer
        monkeypatch.setattr(grammar, name, lambda *args, name=name: pytest.fail(f"{name}{args}: made again"))
    again = grammar.build_corpus(1, pool=2000)
    rows_again, sep_again = grammar.tokenized("val", 40)
    assert again == generated and again is not first  # read from the file, not from this process's cache
    assert rows_again.dtype == rows.dtype == np.int64 and np.array_equal(rows_again, rows)
    assert np.array_equal(sep_again, sep_at) and sep_again.dtype == np.int64
    assert rows[0, 0] == grammar.BOS_ID and rows.shape[1] == 41


def test_a_changed_generator_or_argument_never_reads_an_old_file(cache_in, monkeypatch):
    names = {grammar.cache_file("corpus", 1, 2000), grammar.cache_file("corpus", 2, 2000)}
    names.add(grammar.cache_file("tokens", "val", 32, 1))
    names.add(grammar.cache_file("tokens", "val", 40, 1))
    names.add(grammar.cache_file("tokens", "test", 32, 1))
    before = grammar.cache_file("corpus", 1, 2000)
    monkeypatch.setattr(grammar, "_sources_digest", lambda: "a generator edited since")
    names.add(grammar.cache_file("corpus", 1, 2000))
    assert len(names) == 6 and grammar.cache_file("corpus", 1, 2000) != before
    assert all(p.parent == cache_in for p in names)
    monkeypatch.setattr(grammar, "_sources_digest", lambda: None)  # a source that cannot be read
    assert grammar.cache_file("corpus", 1, 2000) is None


def test_an_unreadable_file_is_generated_again_and_rewritten(cache_in):
    path = grammar.cache_file("corpus", 1, 2000).with_suffix(".json")
    cache_in.mkdir()
    for broken in ('{"train": [["only", "two"]]}', "not json at all", '{"train": []}'):
        path.write_text(broken)
        grammar.build_corpus.cache_clear()
        assert grammar.build_corpus(1, pool=2000) == grammar.generate_corpus(1, pool=2000), broken
        assert json.loads(path.read_text())["test"], "rewritten whole"
    tokens = grammar.cache_file("tokens", "val", 32, 0).with_suffix(".npz")
    made = grammar._tokenize(grammar.generate_corpus(0)["val"], 32)
    for broken in (b"PK\x03\x04 half a zip file", b"", b"\x93NUMPY not an archive"):
        tokens.write_bytes(broken)
        grammar.tokenized.cache_clear()
        rows, sep_at = grammar.tokenized("val", 32)
        assert np.array_equal(rows, made[0]) and np.array_equal(sep_at, made[1]), broken
        assert tokens.stat().st_size > 1000, "rewritten whole"
    assert not [p for p in cache_in.iterdir() if p.name.endswith(".tmp")], "no temporary file left"


def test_an_empty_cache_variable_keeps_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(grammar.CACHE_VARIABLE, "")
    assert grammar.cache_dir() is None and grammar.cache_file("corpus", 0, 40_000) is None
    monkeypatch.delenv(grammar.CACHE_VARIABLE)
    assert grammar.cache_dir() == Path(grammar.__file__).resolve().parent.parent / "out" / "cache"


def test_every_error_has_exactly_one_correction():
    """The same erroneous sentence never appears with two different corrections, and an error
    changes exactly one word (the verb or a determiner) of the correct sentence."""
    corrections: dict[str, str] = {}
    kinds = set()
    for examples in grammar.build_corpus().values():
        for e in examples:
            assert corrections.setdefault(e.wrong, e.right) == e.right, (e.wrong, e.right, corrections[e.wrong])
            w, r = e.wrong.split(), e.right.split()
            assert len(w) == len(r)
            changed = sum(a != b for a, b in zip(w, r))
            assert changed == (0 if e.kind == "none" else 1), e
            kinds.add((e.lang, e.kind))
    assert kinds == {(lang, k) for lang in ("es", "en") for k in ("verb", "tense", "article", "none")}


def test_corrections_follow_the_grammar():
    """Spot-check the generator's output against hand-written rules."""
    assert grammar.es_conjugate("hablar", "present", 3) == "hablamos"
    assert grammar.es_conjugate("comer", "past", 5) == "comieron"
    assert grammar.es_conjugate("escribir", "present", 1) == "escribes"
    assert grammar.en_conjugate("cook", "present", 2) == "cooks"
    assert grammar.en_conjugate("eat", "past", 0) == "ate"
    rights = {e.right for ex in grammar.build_corpus().values() for e in ex}
    for right in random.Random(0).sample(sorted(rights), 2000):
        words = right.split()
        if words[0] in ("nosotros", "nosotras"):
            assert words[1].endswith(("amos", "emos", "imos")), right
        if words[0] in ("he", "she") and words[1] in {v[0][0] for v in grammar.EN_VERBS.values()}:
            pytest.fail(f"'{right}': he/she with the bare verb form")


def test_rank_slices_of_get_batch_cover_the_global_batch():
    whole = grammar.get_batch("train", step=3, batch_size=64)
    for world in (2, 4):
        parts = [grammar.get_batch("train", 3, 64, rank=r, world_size=world) for r in range(world)]
        for i in range(3):  # x, y, loss_mask
            assert torch.equal(torch.cat([p[i] for p in parts]), whole[i])
    with pytest.raises(ValueError, match="not divisible"):
        grammar.get_batch("train", 0, 63, rank=0, world_size=2)


def test_batches_are_fixed_length_and_mask_only_the_correction():
    x, y, mask = grammar.get_batch("train", step=0, batch_size=32)
    assert x.shape == y.shape == mask.shape == (32, 32)
    assert 32 <= x.shape[1] <= 64
    assert torch.equal(x[:, 1:], y[:, :-1]), "targets are the inputs shifted by one"
    for row_x, row_y, row_m in zip(x.tolist(), y.tolist(), mask.tolist()):
        sep = row_x.index(grammar.SEP_ID)
        eos = row_y.index(grammar.EOS_ID)
        expected = [sep <= t <= eos for t in range(32)]
        assert row_m == expected, grammar.decode(row_x)


def test_batches_depend_only_on_step_and_seed():
    a = grammar.get_batch("train", 5, 16, seed=0)
    b = grammar.get_batch("train", 5, 16, seed=0)
    c = grammar.get_batch("train", 5, 16, seed=1)
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])
    n = len(grammar.tokenized("train")[0])
    epoch = {int(i) for s in range(n // 64) for i in grammar.batch_rows("train", s, 64)}
    assert len(epoch) == (n // 64) * 64, "no sentence repeats within an epoch"


class _Tutor:
    """A stand-in for a trained model: right on the sentences whose prompt length is even, a loss
    that depends on each batch's tokens (so a batch scored twice or missed changes the sum)."""

    training = False

    def __init__(self):
        rows, seps = grammar.tokenized("test", 32)
        self.targets = {}
        for row, s in zip(rows.tolist(), seps.tolist()):
            self.targets[tuple(row[: s + 1])] = row[s + 1 : row.index(grammar.EOS_ID, s) + 1]

    def eval(self):
        return self

    def train(self, mode=True):
        return self

    def __call__(self, x, y, mask):
        return None, (x.double() * mask).sum() / (1 + mask.sum()) / 1000

    def generate(self, prompts, eos_id):
        return [self.targets[tuple(p)] if len(p) % 2 == 0 else [eos_id] for p in prompts]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_the_scorers_batches_dealt_over_ranks_add_up_to_one_processs_score(world_size):
    """entry.tutor_score deals the scorer's batches out over the ranks and adds them up: the sum of
    every rank's rows must be one process's score, bit for bit (loss, correct, total)."""
    tutor, n, size = _Tutor(), 1100, 250  # 5 batches, the last one short
    whole = grammar.score(tutor, "test", max_sentences=n, batch_size=size)
    parts = [
        grammar.batch_scores(tutor, "test", n, size, mine=lambda b, r=r: b % world_size == r) for r in range(world_size)
    ]
    assert all(p.shape == (5, 3) for p in parts)
    assert all(int((p[:, 2] > 0).sum()) == len(range(r, 5, world_size)) for r, p in enumerate(parts))
    added = grammar.combine_scores(sum(parts))
    assert added == whole, (added, whole)
    assert whole["total"] == n and 0 < whole["correct"] < n
    with pytest.raises(ValueError, match="no sentence was scored"):
        grammar.combine_scores(torch.zeros(5, 3, dtype=torch.float64))


def test_the_split_loss_is_the_scorers_loss_without_decoding():
    """The trainer's final validation loss (grammar.split_loss): the scorer's loss over the same batches,
    bit for bit, and not one sentence decoded."""
    tutor, n, size = _Tutor(), 1100, 250
    expected = grammar.score(tutor, "test", max_sentences=n, batch_size=size)["loss"]

    def no_decoding(prompts, eos_id):
        raise AssertionError("split_loss decoded a sentence")

    tutor.generate = no_decoding
    assert grammar.split_loss(tutor, "test", max_sentences=n, batch_size=size) == expected
