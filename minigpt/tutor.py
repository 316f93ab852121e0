"""Ask the trained tutor: ``python -m minigpt.tutor "nosotros habla español"``.

Loads a checkpoint written by ``python -m minigpt.train`` (default ``out/minigpt.pt``), reads each
sentence, and prints the greedy correction with the words that changed. The tutor knows only the
course's small grammar (``minigpt.grammar``): a word outside its vocabulary is an error that names
the word, not a guess.
"""

from __future__ import annotations

import sys

from minigpt import cli, grammar
from minigpt.train import DEFAULT_CHECKPOINT, fail, load_checkpoint, missing_checkpoint, model_from_checkpoint


def correct(model, sentence: str) -> str:
    """The tutor's correction of one sentence (ValueError for unknown words or a long input)."""
    ids = grammar.encode(sentence)
    if not ids:
        raise ValueError("empty sentence")
    prompt = [grammar.BOS_ID, *ids, grammar.SEP_ID]
    room = model.config.block_size - len(prompt)
    if room < len(ids) + 1:
        raise ValueError(
            f"the sentence has {len(ids)} words; this tutor reads at most {(model.config.block_size - 3) // 2}"
        )
    out = model.generate([prompt], eos_id=grammar.EOS_ID)[0]
    if out and out[-1] == grammar.EOS_ID:
        out = out[:-1]
    return grammar.decode(out)


def describe_change(before: str, after: str) -> str:
    a, b = before.split(), after.split()
    if a == b:
        return "already correct"
    if len(a) == len(b):
        return ", ".join(f"{x} -> {y}" for x, y in zip(a, b) if x != y)
    return "rewritten"


def main(argv: list[str] | None = None) -> list[str]:
    p = cli.ArgumentParser(prog="python -m minigpt.tutor", name="minigpt.tutor", description=__doc__.split("\n")[0])
    p.add_argument("sentences", nargs="+", metavar="SENTENCE", help="one sentence per argument (quote it)")
    p.add_argument("--checkpoint", default=DEFAULT_CHECKPOINT, help=f"(default {DEFAULT_CHECKPOINT})")
    args = p.parse_args(argv)
    try:
        normalised = [grammar.decode(grammar.encode(s)) for s in args.sentences]
        missing_checkpoint("--checkpoint", args.checkpoint)
        model = model_from_checkpoint(load_checkpoint(args.checkpoint))
        model.eval()
        answers = []
        for sentence in normalised:
            fixed = correct(model, sentence)
            answers.append(fixed)
            print(f"{sentence}\n  -> {fixed}   ({describe_change(sentence, fixed)})")
    except ValueError as exc:  # UnknownWordError is a ValueError too
        fail(str(exc), prog="minigpt.tutor")
    sys.stdout.flush()
    return answers


if __name__ == "__main__":
    main()
