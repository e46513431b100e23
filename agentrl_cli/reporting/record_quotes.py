"""Numbers that prose quotes from records, found and rewritten in place.

A quote is a sentence's template: literal text with `{REF}` placeholders, each a number (or a
verdict word) that a record gives (`records.QUOTES` lists them; `records.quoted` turns a REF
into its text). The template's literal words locate the sentence in a page, whatever the line
breaks; its placeholders then match any number, so a number edited by hand is found and told
apart from the record's, and `rewrite` puts the record's back. Pure text: no records here.
"""
from __future__ import annotations

import re
from typing import Callable

PLACEHOLDER = re.compile(r"\{([^{}]+)\}")
# a number ends in a digit: `0.304,` in prose quotes 0.304
NUMBER = r"[-+]?[0-9](?:[0-9.,]*[0-9])?(?:%|x)?(?: ± [0-9](?:[0-9.,]*[0-9])?)?"
WORD = r"[a-z]+"


def refs(template: str) -> list[str]:
    """The placeholders of a template, in order."""
    return PLACEHOLDER.findall(template)


def pattern(template: str) -> re.Pattern:
    """The template as a regular expression: its literal text with any run of white space
    matching any other (a page rewraps its lines), each placeholder a group matching a number
    (`REF:verdict`: a word)."""
    out, last = [], 0
    for m in PLACEHOLDER.finditer(template):
        out.append(_literal(template[last:m.start()]))
        out.append(f"({WORD if m.group(1).endswith(':verdict') else NUMBER})")
        last = m.end()
    out.append(_literal(template[last:]))
    return re.compile("".join(out))


def _literal(text: str) -> str:
    return r"\s+".join(re.escape(part) for part in re.split(r"\s+", text))


def short(template: str, width: int = 60) -> str:
    """The template's opening words on one line, to name a quote in a message."""
    text = " ".join(PLACEHOLDER.sub("…", template).split())
    return text if len(text) <= width else text[:width - 1] + "…"


def compare(text: str, template: str, value: Callable[[str], str]) -> tuple[re.Match | None, list[tuple[str, str, str]]]:
    """(the quote's match in `text` or None, [(REF, page's text, record's text) for each
    placeholder whose number differs from the record's])."""
    m = pattern(template).search(text)
    if m is None:
        return None, []
    wrong = [(ref, got, value(ref)) for ref, got in zip(refs(template), m.groups()) if got != value(ref)]
    return m, wrong


def rewrite(text: str, template: str, value: Callable[[str], str]) -> str:
    """`text` with the quote's numbers set to the record's (unchanged when it is not there)."""
    m = pattern(template).search(text)
    if m is None:
        return text
    parts, last = [], m.start()
    for i, ref in enumerate(refs(template), 1):
        parts += [text[last:m.start(i)], value(ref)]
        last = m.end(i)
    return text[:m.start()] + "".join(parts) + text[last:]
