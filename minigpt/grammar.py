"""The grammar-tutor corpus: a tiny Spanish + English grammar, generated, never downloaded.

**The task.** Every example is a short sentence that (usually) contains one grammar error,
followed by the corrected sentence::

    <bos> nosotros habla español <sep> nosotros hablamos español <eos>
    <bos> yesterday she cooks the soup <sep> yesterday she cooked the soup <eos>
    <bos> compro la libros <sep> ...          (not generated: every sentence has a subject)

Sentences have the shape ``[time adverb] subject verb object``. Three kinds of error are made:

* **verb agreement**: the verb is conjugated for the wrong person (``nosotros habla``);
* **tense**: the verb is in the wrong tense for the time adverb (``ayer ellos comen`` -> ``comieron``);
  Spanish uses the present and the preterite, English the present and the simple past;
* **article-noun agreement**: the determiner has the wrong gender or number for its noun
  (``la perros`` -> ``los perros``, ``a apple`` -> ``an apple``, ``this books`` -> ``these books``).

One in ten inputs is already correct and must be copied unchanged, so a tutor does not learn that
"something is always wrong". The correction is always unique: the subject, the nouns and the time
adverb are trusted, and only the verb or the determiner is corrected. A sentence without a time
adverb keeps the tense of the verb it was given, so there the error is one of person only (and a
verb form that would make the tense ambiguous, like ``hablamos``, is never used as the error).

**The vocabulary.** Word level: every form of every word in :mod:`minigpt.lexicon`, plus four
special tokens (``<pad>``, ``<bos>``, ``<sep>``, ``<eos>``): **609 tokens in all** (605 words).
Lookup is case-insensitive (``Español`` -> ``español``, ``i`` -> ``I``). ``tests/test_grammar.py``
checks the count.

**The splits.** A pool of distinct correct sentences is sampled with a seeded generator and each
sentence is put in train, validation or test by a hash of its text, so the three splits never share
a sentence (neither the correction nor, since the correction is unique, the erroneous input).

**The batches.** Every sequence is ``block_size`` tokens long (default 32). The loss counts only
the correction: the tokens after ``<sep>`` and the closing ``<eos>``. :func:`get_batch` is
stateless: the global batch of a step is a function of (split, step, batch size, seed), and rank
``r`` of ``N`` data-parallel workers takes rows ``r*B/N .. (r+1)*B/N - 1`` of it
(:func:`rank_slice`). Every lab builds on that: N ranks together see exactly the batch one process
sees. The first process to need the corpus generates it and keeps it in ``out/cache/`` for the
others (:func:`cache_dir`; how and why: the comment above :data:`CACHE_VARIABLE`).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import random
import sys
import threading
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

import numpy as np
import torch

from minigpt import lexicon
from minigpt.lexicon import (  # noqa: F401 - re-exported: grammar.ES_VERBS etc.
    EN_ADVERBS,
    EN_DETERMINER_SWAP,
    EN_DETERMINERS,
    EN_LANGUAGES,
    EN_NOUNS,
    EN_PRONOUNS,
    EN_VERBS,
    ES_ADVERBS,
    ES_ARTICLES,
    ES_LANGUAGES,
    ES_NOUNS,
    ES_PRONOUNS,
    ES_VERBS,
    en_conjugate,
    en_determiner_ok,
    es_conjugate,
)

PAD, BOS, SEP, EOS = "<pad>", "<bos>", "<sep>", "<eos>"
SPECIALS = (PAD, BOS, SEP, EOS)
PAD_ID, BOS_ID, SEP_ID, EOS_ID = 0, 1, 2, 3

# ----------------------------------------------------------------------------------------------
# The vocabulary


@cache
def vocabulary() -> tuple[str, ...]:
    """All tokens: the four specials first (ids 0-3), then every word form, sorted."""
    words: set[str] = set(ES_PRONOUNS) | set(ES_LANGUAGES) | set(ES_ARTICLES.values())
    for phrase in ES_ADVERBS:
        words.update(phrase.split())
    for nouns in ES_NOUNS.values():
        for singular, plural, _ in nouns:
            words.update((singular, plural))
    for infinitive in ES_VERBS:
        for tense in ("present", "past"):
            words.update(es_conjugate(infinitive, tense, p) for p in range(6))
    words |= set(EN_PRONOUNS) | set(EN_LANGUAGES)
    words |= set(EN_DETERMINERS)
    for phrase in EN_ADVERBS:
        words.update(phrase.split())
    for nouns in EN_NOUNS.values():
        for singular, plural in nouns:
            words.update((singular, plural))
    for forms, _ in EN_VERBS.values():
        words.update(forms)
    return SPECIALS + tuple(sorted(words))


@cache
def _token_ids() -> dict[str, int]:
    ids = {}
    for i, word in enumerate(vocabulary()):
        ids.setdefault(word.lower(), i)
        ids[word] = i
    return ids


VOCAB_SIZE = len(vocabulary())


class UnknownWordError(ValueError):
    """A word the tutor has never seen; the message names it."""


def encode(sentence: str) -> list[int]:
    """Word ids of a sentence (case-insensitive; surrounding punctuation is ignored)."""
    ids = _token_ids()
    out = []
    for raw in sentence.split():
        word = raw.strip(".,;:!?¡¿\"'")
        if not word:
            continue
        if word in ids:
            out.append(ids[word])
        elif word.lower() in ids:
            out.append(ids[word.lower()])
        else:
            close = difflib.get_close_matches(word.lower(), list(ids), n=3)
            hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise UnknownWordError(
                f"unknown word {word!r}: the tutor knows {VOCAB_SIZE - 4} "
                f"word forms (minigpt.grammar.vocabulary()){hint}"
            )
    return out


def decode(ids) -> str:
    """The inverse of :func:`encode`: ids back to space-separated words (specials included)."""
    vocab = vocabulary()
    return " ".join(vocab[int(i)] for i in ids)


# ----------------------------------------------------------------------------------------------
# Sentence generation


@dataclass(frozen=True)
class Example:
    """One tutoring example: the sentence shown to the tutor and its correction."""

    wrong: str
    right: str
    kind: str  # "verb", "tense", "article" or "none"
    lang: str  # "es" or "en"


@dataclass
class _Sentence:
    """A correct sentence and the places where an error can be made in it."""

    words: list[str]
    verb_at: int  # index of the verb
    verb_forms: dict[str, str]  # every form of this verb -> "verb" (same tense) or "tense"
    wrong_verbs: list[str]  # forms that make a correctable error here
    article_slots: list[tuple[int, list[str]]]  # (index of a determiner, wrong alternatives)


def _es_noun_phrase(rng: random.Random, category: str) -> tuple[list[str], bool]:
    singular, plural, gender = rng.choice(ES_NOUNS[category])
    is_plural = rng.random() < 0.5
    article = ES_ARTICLES[(rng.random() < 0.6, gender, is_plural)]
    return [article, plural if is_plural else singular], is_plural


def _en_noun_phrase(rng: random.Random, category: str) -> tuple[list[str], bool]:
    singular, plural = rng.choice(EN_NOUNS[category])
    is_plural = rng.random() < 0.5
    noun = plural if is_plural else singular
    choices = [d for d in EN_DETERMINERS if en_determiner_ok(d, noun, is_plural)]
    weights = [3 if d == "the" else 1 for d in choices]
    return [rng.choices(choices, weights)[0], noun], is_plural


def _frame(rng: random.Random, adverbs: dict, pronouns: dict, noun_phrase) -> tuple:
    """What both languages draw alike: a time adverb (or none) and the tense it fixes, then the
    subject (a pronoun, or a noun phrase in the third person) and its person."""
    adverb = rng.choice(list(adverbs) + [None])
    tense = adverbs[adverb] if adverb else rng.choice(["present", "past"])
    if rng.random() < 0.35:
        subject, plural = noun_phrase(rng, "person")
        person = 5 if plural else 2
    else:
        pronoun = rng.choice(list(pronouns))
        subject, person = [pronoun], pronouns[pronoun]
    return adverb, tense, subject, person


def _object(rng: random.Random, categories: list[str], languages: list[str], noun_phrase) -> list[str]:
    category = rng.choice(categories)
    return [rng.choice(languages)] if category == "language" else noun_phrase(rng, category)[0]


def _spanish_sentence(rng: random.Random) -> _Sentence:
    adverb, tense, subject, person = _frame(rng, ES_ADVERBS, ES_PRONOUNS, _es_noun_phrase)
    infinitive = rng.choice(list(ES_VERBS))
    obj = _object(rng, ES_VERBS[infinitive], ES_LANGUAGES, _es_noun_phrase)
    head = [adverb] if adverb else []
    words = head + subject + [es_conjugate(infinitive, tense, person)] + obj
    verb_at = len(head) + len(subject)
    other = "past" if tense == "present" else "present"
    same = {es_conjugate(infinitive, tense, p) for p in range(6)}
    others = {es_conjugate(infinitive, other, p) for p in range(6)}
    # With an adverb the tense is known, so any other form is a correctable error; without one
    # the form must show its tense unambiguously (never "hablamos", present and preterite alike).
    wrong = (same | others) if adverb else (same - others)
    slots = []
    for at, phrase in ((len(head), subject), (verb_at + 1, obj)):
        if len(phrase) == 2:
            definite = phrase[0] in ("el", "la", "los", "las")
            alternatives = {a for (d, _, _), a in ES_ARTICLES.items() if d == definite}
            slots.append((at, sorted(alternatives - {phrase[0]})))
    forms = {f: "tense" for f in others} | {f: "verb" for f in same}
    return _Sentence(words, verb_at, forms, sorted(wrong - {words[verb_at]}), slots)


def _english_sentence(rng: random.Random) -> _Sentence:
    adverb, tense, subject, person = _frame(rng, EN_ADVERBS, EN_PRONOUNS, _en_noun_phrase)
    verb = rng.choice(list(EN_VERBS))
    (base, third, past), categories = EN_VERBS[verb]
    obj = _object(rng, categories, EN_LANGUAGES, _en_noun_phrase)
    head = adverb.split() if adverb else []
    words = head + subject + [en_conjugate(verb, tense, person)] + obj
    verb_at = len(head) + len(subject)
    if adverb:
        wrong = {base, third, past}
    elif tense == "present":  # no adverb: only a person error is correctable
        wrong = {base, third}
    else:  # the English past has a single form: nothing to get wrong without an adverb
        wrong = set()
    slots = []
    for at, phrase in ((len(head), subject), (verb_at + 1, obj)):
        if len(phrase) == 2 and phrase[0] in EN_DETERMINER_SWAP:
            slots.append((at, [EN_DETERMINER_SWAP[phrase[0]]]))
    same = {base, third} if tense == "present" else {past}
    forms = {f: ("verb" if f in same else "tense") for f in (base, third, past)}
    return _Sentence(words, verb_at, forms, sorted(wrong - {words[verb_at]}), slots)


def make_example(rng: random.Random, lang: str, p_correct: float = 0.1) -> Example:
    """One example: draw a correct sentence, then break one word of it (or, rarely, none)."""
    sentence = _spanish_sentence(rng) if lang == "es" else _english_sentence(rng)
    right = " ".join(sentence.words)
    kinds = (["verb"] if sentence.wrong_verbs else []) + (["article"] if sentence.article_slots else [])
    if rng.random() < p_correct or not kinds:
        return Example(right, right, "none", lang)
    wrong = list(sentence.words)
    if rng.choice(kinds) == "verb":
        wrong[sentence.verb_at] = rng.choice(sentence.wrong_verbs)
        kind = sentence.verb_forms[wrong[sentence.verb_at]]
    else:
        at, alternatives = rng.choice(sentence.article_slots)
        wrong[at] = rng.choice(alternatives)
        kind = "article"
    return Example(" ".join(wrong), right, kind, lang)


# ----------------------------------------------------------------------------------------------
# The corpus and its splits

SPLITS = ("train", "val", "test")


def split_of(sentence: str) -> str:
    """The split a correct sentence belongs to: fixed by a hash of its text (3% val, 3% test)."""
    bucket = int(hashlib.sha1(sentence.encode()).hexdigest(), 16) % 100
    return "val" if bucket < 3 else "test" if bucket < 6 else "train"


# Generating the corpus takes about a second of CPU, and every process that trains or scores needs it
# (every rank of every run). So the first one keeps what it generated in a file that the others read
# (a fifth of the time): the corpus as JSON, each split's token rows as NumPy arrays. The file's name
# is a hash of what generates it (this file, minigpt/lexicon.py, the arguments and Python's version):
# a changed generator never reads an old file. The file is written whole or not at all (a temporary
# file, then a rename), and one that cannot be read is generated again and rewritten.
CACHE_VARIABLE = "MINIGPT_CACHE_DIR"  # where; empty: nothing is kept (every process generates it)
CACHE_FORMAT = 1


def cache_dir() -> Path | None:
    """Where the generated corpus is kept: ``MINIGPT_CACHE_DIR``, else ``out/cache/`` in the
    repository (git-ignored, emptied by ``make clean``); None when ``MINIGPT_CACHE_DIR`` is empty."""
    where = os.environ.get(CACHE_VARIABLE)
    if where is not None:
        return Path(where) if where.strip() else None
    return Path(__file__).resolve().parent.parent / "out" / "cache"


@cache
def _sources_digest() -> str | None:
    """A hash of the generator's source (None where it cannot be read: then nothing is kept)."""
    digest = hashlib.sha256()
    try:
        for source in (Path(__file__), Path(lexicon.__file__)):
            digest.update(source.read_bytes())
    except OSError:
        return None
    return digest.hexdigest()


def cache_file(kind: str, *args: object) -> Path | None:
    """The file that keeps ``kind`` (``corpus`` or ``tokens``) for these arguments, or None."""
    folder = cache_dir()
    if folder is None or _sources_digest() is None:
        return None
    key = f"{CACHE_FORMAT} {_sources_digest()} {sys.version_info[:2]} {args}"
    return folder / f"{kind}-{hashlib.sha256(key.encode()).hexdigest()[:20]}"


def _keep(path: Path, write: Callable[[Path], None]) -> None:
    """``write`` into a temporary file beside ``path``, then renamed to it; nothing kept when the
    folder cannot be written (the run goes on, generating it again next time)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


@lru_cache(maxsize=4)
def build_corpus(seed: int = 0, pool: int = 40_000) -> dict[str, tuple[Example, ...]]:
    """``pool`` examples with distinct corrections, half Spanish and half English, split: read from
    the cache file (:func:`cache_dir`) when an earlier process kept it, else generated
    (:func:`generate_corpus`) and kept."""
    path = cache_file("corpus", seed, pool)
    if path is not None:
        path = path.with_suffix(".json")
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
            return {name: tuple(Example(*row) for row in rows[name]) for name in SPLITS}
        except (OSError, ValueError, KeyError, TypeError):
            pass  # not kept yet, or unreadable: generated and kept again
    corpus = generate_corpus(seed, pool)
    if path is not None:
        rows = {name: [[e.wrong, e.right, e.kind, e.lang] for e in examples] for name, examples in corpus.items()}
        _keep(path, lambda tmp: tmp.write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8"))
    return corpus


def generate_corpus(seed: int = 0, pool: int = 40_000) -> dict[str, tuple[Example, ...]]:
    """The corpus itself: ``pool`` examples with distinct corrections, half Spanish and half English,
    drawn from a generator seeded with ``seed``, each put in its split by :func:`split_of`."""
    rng = random.Random(seed)
    seen: set[str] = set()
    splits: dict[str, list[Example]] = {name: [] for name in SPLITS}
    while len(seen) < pool:
        example = make_example(rng, "es" if len(seen) % 2 == 0 else "en")
        if example.right in seen:
            continue
        seen.add(example.right)
        splits[split_of(example.right)].append(example)
    return {name: tuple(examples) for name, examples in splits.items()}


@lru_cache(maxsize=16)
def tokenized(split: str, block_size: int = 32, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Every example of a split as fixed-length rows of ``block_size + 1`` token ids, plus the
    position of each row's ``<sep>``. Row layout: ``<bos> wrong <sep> right <eos> <pad>...``."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    path = cache_file("tokens", split, block_size, seed)
    if path is not None:
        path = path.with_suffix(".npz")
        try:
            with np.load(path) as kept:  # kept as 16-bit ids (609 tokens), trained on as int64
                return kept["rows"].astype(np.int64), kept["sep_at"].astype(np.int64)
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            pass  # not kept yet, or unreadable: made and kept again
    rows, sep_at = _tokenize(build_corpus(seed)[split], block_size)
    if path is not None:
        _keep(path, lambda tmp: _save_arrays(tmp, rows=rows.astype(np.uint16), sep_at=sep_at.astype(np.uint16)))
    return rows, sep_at


def _save_arrays(path: Path, **arrays: np.ndarray) -> None:
    with path.open("wb") as f:  # a file, not a name: np.savez would add ".npz" to the temporary name
        np.savez(f, **arrays)


def _tokenize(examples: tuple[Example, ...], block_size: int) -> tuple[np.ndarray, np.ndarray]:
    rows = np.full((len(examples), block_size + 1), PAD_ID, dtype=np.int64)
    sep_at = np.zeros(len(examples), dtype=np.int64)
    for i, ex in enumerate(examples):
        ids = [BOS_ID, *encode(ex.wrong), SEP_ID, *encode(ex.right), EOS_ID]
        if len(ids) > block_size + 1:
            raise ValueError(
                f"block_size {block_size} is too short for {ex.wrong!r} "
                f"({len(ids)} tokens); use at least {len(ids) - 1}"
            )
        rows[i, : len(ids)] = ids
        sep_at[i] = len(ex.wrong.split()) + 1
    return rows, sep_at


def rank_slice(batch_size: int, rank: int, world_size: int) -> slice:
    """The rows of a global batch that data-parallel rank ``rank`` of ``world_size`` trains on:
    ``rank*B/N .. (rank+1)*B/N - 1``. The slices are disjoint and cover the batch."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}")
    if batch_size % world_size:
        raise ValueError(
            f"the global batch size {batch_size} is not divisible by the world "
            f"size {world_size}; use a multiple of {world_size}"
        )
    per_rank = batch_size // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)


@lru_cache(maxsize=8)
def _epoch_order(n: int, epoch: int, seed: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n)


def batch_rows(split: str, step: int, batch_size: int, seed: int = 0, block_size: int = 32) -> np.ndarray:
    """Indices into the split of the global batch of ``step``: a seeded reshuffle every epoch,
    a pure function of its arguments (so a resumed run sees exactly the same batches)."""
    n = len(tokenized(split, block_size)[0])
    start = step * batch_size
    positions = np.arange(start, start + batch_size)
    return np.array([_epoch_order(n, int(p // n), seed)[p % n] for p in positions])


def get_batch(
    split: str, step: int, batch_size: int, rank: int = 0, world_size: int = 1, seed: int = 0, block_size: int = 32
):
    """This rank's slice of the global batch of ``step``: ``(x, y, loss_mask)``, each of shape
    ``(batch_size / world_size, block_size)``. ``y`` is ``x`` shifted by one; ``loss_mask`` is
    True exactly where ``y`` is a word of the correction or the final ``<eos>``."""
    rows_all, sep_all = tokenized(split, block_size)
    chosen = batch_rows(split, step, batch_size, seed, block_size)[rank_slice(batch_size, rank, world_size)]
    rows, sep_at = torch.from_numpy(rows_all[chosen]), torch.from_numpy(sep_all[chosen])
    x, y = rows[:, :-1], rows[:, 1:]
    t = torch.arange(block_size)
    loss_mask = (t[None, :] >= sep_at[:, None]) & (y != PAD_ID)
    return x.contiguous(), y.contiguous(), loss_mask


# ----------------------------------------------------------------------------------------------
# The scorer


@torch.no_grad()
def score(
    model, split: str = "test", max_sentences: int | None = None, batch_size: int = 500, block_size: int = 32
) -> dict:
    """Exact-match correction accuracy (greedy decoding) and the masked loss on a split.

    ``model`` is a :class:`minigpt.model.MiniGPT` (or anything with its ``forward`` and
    ``generate``). Returns ``{"loss", "accuracy", "correct", "total"}``.
    """
    return combine_scores(batch_scores(model, split, max_sentences, batch_size, block_size))


def score_batches(n_sentences: int, batch_size: int = 500) -> int:
    """How many batches :func:`score` cuts ``n_sentences`` into."""
    return -(-n_sentences // batch_size)


def scored_sentences(split: str, max_sentences: int | None, block_size: int = 32) -> int:
    n = len(tokenized(split, block_size)[0])
    return n if max_sentences is None else min(max_sentences, n)


def _batches(split: str, n: int, batch_size: int, block_size: int):
    """The scorer's batches of the first ``n`` sentences of a split: ``(index, rows, sep_at, x, y, mask)``."""
    rows_all, sep_all = tokenized(split, block_size)
    for b, start in enumerate(range(0, n, batch_size)):
        rows = torch.from_numpy(rows_all[start : start + batch_size][: n - start])
        sep_at = torch.from_numpy(sep_all[start : start + batch_size][: n - start])
        x, y = rows[:, :-1], rows[:, 1:]
        mask = (torch.arange(block_size)[None, :] >= sep_at[:, None]) & (y != PAD_ID)
        yield b, rows, sep_at, x, y, mask


def _batch_loss(model, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> float:
    device = next(model.parameters()).device if isinstance(model, torch.nn.Module) else None  # a GPU's, there
    _, loss = model(x.to(device), y.to(device), mask.to(device)) if device else model(x, y, mask)
    return float(loss)


@torch.no_grad()
def split_loss(
    model, split: str = "val", max_sentences: int | None = None, batch_size: int = 500, block_size: int = 32
) -> float:
    """The masked loss on a split, batch by batch as :func:`score` takes it (the same number, bit for
    bit), without its greedy decoding: a forward pass per batch."""
    n = scored_sentences(split, max_sentences, block_size)
    was_training = model.training
    model.eval()
    loss_sum = 0.0
    for _, rows, _, x, y, mask in _batches(split, n, batch_size, block_size):
        loss_sum += _batch_loss(model, x, y, mask) * len(rows)
    model.train(was_training)
    return loss_sum / n


@torch.no_grad()
def batch_scores(
    model,
    split: str = "test",
    max_sentences: int | None = None,
    batch_size: int = 500,
    block_size: int = 32,
    mine: Callable[[int], bool] = lambda batch: True,
) -> torch.Tensor:
    """The scorer's work batch by batch: a float64 tensor of one row per batch, ``(loss x rows,
    correct, rows)``, zeros for a batch that ``mine(batch)`` leaves to another rank. The batches
    are the same whoever scores them, so a sum over ranks that split them is the one process's
    score, bit for bit (:func:`combine_scores`)."""
    n = scored_sentences(split, max_sentences, block_size)
    found = torch.zeros(score_batches(n, batch_size), 3, dtype=torch.float64)
    was_training = model.training
    model.eval()
    for b, rows, sep_at, x, y, mask in _batches(split, n, batch_size, block_size):
        if not mine(b):
            continue
        loss = _batch_loss(model, x, y, mask)
        prompts = [row[: s + 1].tolist() for row, s in zip(rows, sep_at.tolist())]
        outputs = model.generate(prompts, eos_id=EOS_ID)
        correct = 0
        for row, s, out in zip(rows.tolist(), sep_at.tolist(), outputs):
            target = row[s + 1 : row.index(EOS_ID, s) + 1]
            correct += out == target
        found[b] = torch.tensor([loss * len(rows), correct, len(rows)], dtype=torch.float64)
    model.train(was_training)
    return found


def combine_scores(found: torch.Tensor) -> dict:
    """:func:`score`'s result from :func:`batch_scores`'s rows (summed in batch order)."""
    loss_sum, correct, n = 0.0, 0, 0
    for loss_rows, right, rows in found.tolist():
        loss_sum += loss_rows
        correct += int(right)
        n += int(rows)
    if n == 0:
        raise ValueError("no sentence was scored: every batch was left to another rank")
    return {"loss": loss_sum / n, "accuracy": correct / n, "correct": correct, "total": n}
