"""Numbers and words the way each language of the course writes them.

English: "1,234,567.5", "27.3%". Spanish: "1 234 567,5" (a space between thousands, none in a
four-digit integer), "27,3 %". Sizes in decimal units, as the ZeRO paper counts them: 1 GB is
10^9 bytes. Used by every module of :mod:`minigpt.pages`.
"""

from __future__ import annotations

import re

LANGS = ("en", "es")
MB = 10**6


def _check_lang(lang: str) -> None:
    if lang not in LANGS:
        raise ValueError(f"lang must be one of {LANGS}, got {lang!r}")


def num(x: float, lang: str, decimals: int = 0) -> str:
    """1234567.5 -> "1,234,567.5" (en) / "1 234 567,5" (es; four-digit integers ungrouped)."""
    _check_lang(lang)
    text = f"{abs(x):.{decimals}f}"
    whole, _, frac = text.partition(".")
    sep, point = (",", ".") if lang == "en" else (" ", ",")
    if lang == "en" or len(whole) > 4:
        groups = []
        while len(whole) > 3:
            whole, groups = whole[:-3], [whole[-3:]] + groups
        whole = sep.join([whole] + groups)
    sign = "-" if x < 0 and float(text) != 0 else ""
    return sign + whole + (point + frac if frac else "")


def pct(fraction: float, lang: str, decimals: int = 1) -> str:
    """0.2727 -> "27.3%" (en) / "27,3 %" (es)."""
    return num(100 * fraction, lang, decimals) + ("%" if lang == "en" else " %")


def size(n_bytes: float, lang: str, decimals: int = 1, unit: str | None = None) -> str:
    """Bytes in decimal units (the ZeRO paper's GB = 10^9 bytes): "112 GB", "2.03 MB"."""
    units = {"GB": 10**9, "MB": MB, "kB": 10**3, "B": 1}
    if unit is None:
        unit = next(u for u, scale in units.items() if n_bytes >= scale or u == "B")
    return f"{num(n_bytes / units[unit], lang, decimals)} {unit}"


def localize(text: str, lang: str) -> str:
    """A number already written with a decimal point, in the page's language."""
    _check_lang(lang)
    return text if lang == "en" else text.replace(".", ",")


def sci(x: float, lang: str, digits: int = 2) -> str:
    """3e-3 -> "3.0e-3" / "3,0e-3"."""
    mantissa, exponent = f"{x:.{digits - 1}e}".split("e")
    return f"{localize(mantissa, lang)}e{int(exponent)}"


def localize_number(text: str, lang: str) -> str:
    """A number Python formatted (``f"{x:,.2f}"``: "1,234,567.50", "27.3%", "1.2e-05") written the way
    ``lang`` writes numbers: in Spanish "1 234 567,50", "27,3 %", "1,2e-05" (four-digit integers ungrouped)."""
    _check_lang(lang)
    if lang == "en":
        return text
    text = text.replace(",", "\0").replace(".", ",").replace("\0", " ")
    whole = re.match(r"-?[\d ]+", text)
    if whole and re.fullmatch(r"-?\d \d{3}", whole.group(0)):  # 1 234 -> 1234, as num() writes it
        text = whole.group(0).replace(" ", "") + text[whole.end() :]
    return text.replace("%", " %")


class _Localized:
    """A number whose ``format(x, spec)`` is Python's, written the way its language writes numbers."""

    def __init__(self, value, lang: str):
        self.value, self.lang = value, lang

    def __format__(self, spec: str) -> str:
        return localize_number(format(self.value, spec), self.lang)

    def __str__(self) -> str:
        return localize_number(str(self.value), self.lang)


def localized(lang: str):
    """The workbooks' ``L``: ``f"{L(x):,.2f}"`` formats ``x`` as Python does, then as ``lang`` writes it."""
    _check_lang(lang)
    return lambda value: _Localized(value, lang)


def tr(lang: str, en: str, es: str) -> str:
    """The English or the Spanish text, by ``lang``."""
    _check_lang(lang)
    return en if lang == "en" else es


def write_tables(json_path, table) -> list:
    """A measurement's Markdown fragments for the pages: ``X.json`` -> ``X-en.txt`` and ``X-es.txt``,
    each ``table(result, lang)`` of the JSON's content. Returns the paths written."""
    import json
    from pathlib import Path

    json_path = Path(json_path)
    result = json.loads(json_path.read_text())
    written = []
    for lang in LANGS:
        path = json_path.with_name(f"{json_path.stem}-{lang}.txt")
        path.write_text(table(result, lang))
        written.append(path)
    return written


def yes(value: bool, lang: str) -> str:
    """A check's verdict: "yes" / "sí", or a bold "no"."""
    return tr(lang, "yes", "sí") if value else "**" + tr(lang, "no", "no") + "**"


def table(head: list[str], rows: list[list[str]], left: int = 1) -> str:
    """A Markdown table: the first ``left`` columns aligned left, the others (numbers) right."""
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---"] * left + ["---:"] * (len(head) - left)) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
