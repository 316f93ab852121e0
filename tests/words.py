"""The graded tests' messages in the learner's language: ``say(english, spanish)`` returns the one
``MINIGPT_LANG`` asks for (``es``: Spanish; anything else: English). The grader (``python -m
minigpt.grader --lang es``, ``make grade LANG=es``) sets it for the tests it runs.

``refuses(call, run, english, spanish)`` is ``pytest.raises(ValueError)`` with a message that
teaches: when ``run()`` does not raise ValueError, the test fails with one line that names the call
that should have been refused and why, and what came instead."""

from __future__ import annotations

import os
import re
from collections.abc import Callable

VARIABLE = "MINIGPT_LANG"


def spanish() -> bool:
    return os.environ.get(VARIABLE, "").lower().startswith("es")


def say(english: str, spanish_text: str) -> str:
    return spanish_text if spanish() else english


def short(value: object, width: int = 80) -> str:
    """``repr(value)`` on one line, cut to ``width`` characters."""
    text = " ".join(repr(value).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def refuses(call: str, run: Callable[[], object], english: str, spanish_text: str, match: str | None = None) -> None:
    """``run()`` must raise ValueError (whose message matches the regular expression ``match``, as
    ``pytest.raises(ValueError, match=...)`` checks it); ``call`` is how the message writes it
    (``"rank_slice(10, 0, 3)"``), ``english`` and ``spanish_text`` why it must be refused. A stub's
    NotImplementedError goes through untouched: the grader reports it as not written yet."""
    try:
        returned = run()
    except NotImplementedError:
        raise
    except ValueError as exc:
        if match is not None and not re.search(match, str(exc)):
            raise AssertionError(
                say(
                    f"{call} raised ValueError({short(str(exc))}): right, but the message must name {match} "
                    f"({english})",
                    f"{call} lanzó ValueError({short(str(exc))}): bien, pero el mensaje debe nombrar {match} "
                    f"({spanish_text})",
                )
            ) from None
        return
    except Exception as exc:
        raise AssertionError(
            say(
                f"{call} must raise ValueError ({english}); it raised {type(exc).__name__}: {short(str(exc))}",
                f"{call} debe lanzar ValueError ({spanish_text}); lanzó {type(exc).__name__}: {short(str(exc))}",
            )
        ) from None
    raise AssertionError(
        say(
            f"{call} must raise ValueError ({english}); it returned {short(returned)}",
            f"{call} debe lanzar ValueError ({spanish_text}); devolvió {short(returned)}",
        )
    )
