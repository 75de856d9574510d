"""Reading debate turns: the final ``\\boxed{}`` answer (the last box, or several adjacent boxes
merged as math-verify merges them; a last box without braces, ``\\boxed 7``, read as math-verify
reads it), the verifier's verdict, and the conservative normal form
used to compare answers on the event loop.

Pure string operations, linear in the input, safe on the event loop: nothing here parses
mathematics (the closed-form fast path is ``closed_form``; everything else is the grader's
job, in worker processes).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Literal

__all__ = ["LOOP_ANSWER_CHARS", "MAX_ANSWER_BRACES", "MAX_TRAILING_BOXES", "VERDICT_PATTERN", "Verdict", "answer_key",
           "final_answer", "last_boxed", "normalize_answer", "normalize_critique", "parse_verdict"]

Verdict = Literal["CORRECT", "INCORRECT"]

_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)")
VERDICT_PATTERN = re.compile(r"VERDICT\s*[:：]?\s*[*_`\"']*\s*(INCORRECT|CORRECT)\b", re.IGNORECASE)
"""The verdict marker :func:`parse_verdict` reads (group 1: the verdict word); public so that
code locating a verdict in text reads it exactly as the server does."""
_NOISE = re.compile(r"\\[,;:! ]|\\left\b|\\right\b|\$")
_COMMAND_SPACE = re.compile(r"(\\[A-Za-z]+)\s+(?=[A-Za-z])")
_SPACE = re.compile(r"\s+")
_FRAC = re.compile(r"\\[dt]frac\b")
#: the only characters brace matching looks at: an escape pair, or a brace
_BRACE_TOKENS = re.compile(r"\\.|[{}]", re.DOTALL)
#: boxes :func:`final_answer` looks at, counted from the end of a response (the merge rule only
#: ever joins adjacent boxes at the end; real responses have a handful)
MAX_TRAILING_BOXES = 64
#: braces allowed from the first of those boxes to the end of the response. More, and the
#: response has no readable final answer (``None``): brace matching is a Python loop per brace
#: (about 0.3 us each here), so this bounds the event-loop cost of reading any answer to a
#: fraction of a millisecond, whatever the input (5,000 nested braces cost 2 ms before). MATH-500
#: and GSM8K reference solutions have at most 40 there.
MAX_ANSWER_BRACES = 1024


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` (or ``\\fbox{...}``), brace-matched.

    One left-to-right pass with a stack of open braces, so the cost is linear even for
    hostile input (thousands of unclosed boxes). Escaped braces (``\\{``, ``\\}``) and escaped
    backslashes do not count.

    Args:
        text: a model response.

    Returns:
        The content between the braces, stripped (may be ``""`` for ``\\boxed{}``), or
        ``None`` when the text has no complete box. An unclosed last box (a response cut
        mid-answer) is skipped in favour of the previous complete one.
    """
    # Fast path, the common shape: a single ``\\boxed`` (and no ``\\fbox``). Its brace is then
    # the only box opening, the brace tokens before it cannot close it, and scanning the tokens
    # after it with a depth counter finds the same closing brace as the stack below.
    start = text.find("\\boxed")
    if start >= 0 and "\\fbox" not in text and text.find("\\boxed", start + 6) < 0:
        match = _BOX_OPEN.match(text, start)
        if match is None:
            return None
        close = text.find("}", match.end())
        if close >= 0 and "{" not in text[match.end() : close] and "\\" not in text[match.end() : close]:
            return text[match.end() : close].strip()  # plain content: the first ``}`` closes it
        depth = 1
        for token in _BRACE_TOKENS.finditer(text, match.end()):
            brace = token.group()
            if brace == "{":
                depth += 1
            elif brace == "}":
                depth -= 1
                if depth == 0:
                    return text[match.end() : token.start()].strip()
        return None  # the only box is unclosed
    return _last_boxed_scan(text)


def _last_boxed_scan(text: str) -> str | None:
    """``last_boxed`` for any text: brace matching over the whole text; the box opened last
    among the complete ones."""
    closes = _box_closes(text)
    if not closes:
        return None
    best_open = max(closes)
    return text[best_open + 1 : closes[best_open]].strip()


#: math-verify's rule for boxes that together give one answer. math-verify 0.9 reads a bare
#: ``\\boxed{...}`` through ``math_verify/parser.py:lazy_latex_regex`` (its ``\\boxed{.+}``
#: pattern) and ``extract_latex``, which normalises the match with ``boxed="last"``:
#: ``latex2sympy2_extended/math_normalization.py:extract_boxed_content`` (1.11) walks left from
#: the last box and takes an earlier box while ``should_extract_boxed`` holds, i.e. the text
#: between the earlier box's closing brace and the later box's ``\\boxed`` is shorter than 10
#: characters, or shorter than 70, contains a separator (``and``/``or`` as words, ``,`` or
#: ``;``) and the two contents differ; consecutive identical contents count once.
_MERGE_NEAR_CHARS = 10
_MERGE_SEPARATED_CHARS = 70
_MERGE_SEPARATOR = re.compile(r"\b(and|or)\b|,|;")
#: math-verify joins the contents with ``","``; we join with ``", "`` because math-verify reads
#: ``1,234`` as the number 1234 but ``1, 234`` as the list {1, 234}, the collection the boxes give.
_MERGE_JOIN = ", "


def final_answer(text: str) -> str | None:
    """The final answer of a response: the last complete box (as :func:`last_boxed`), merged
    with the boxes right before it when math-verify would merge them (several adjacent boxes:
    ``\\boxed{1} and \\boxed{2}``, ``\\boxed{(2,1)}, \\boxed{(1,2)}``).

    Walking left from the last box, an earlier box joins when fewer than 10 characters separate
    it from the box after it, or fewer than 70 that contain ``and``, ``or``, ``,`` or ``;`` and
    its content differs from that box's (math-verify's ``extract_boxed_content``, see
    ``_MERGE_SEPARATOR``); the walk stops at the first box that does not join, or that is
    unclosed or encloses the box after it. Repeated consecutive contents count once. The merged
    answer is the contents in order joined by ``", "``, a bare list, which the grader reads as
    an unordered collection: ``\\boxed{3} or \\boxed{2}`` is ``3, 2``, not ``2``. A box
    far from the final one (an intermediate result) stays out.

    A last box written without braces (``\\boxed 7``, ``$\\boxed 7$``; TeX boxes the next token,
    models mean the answer that follows) is read as math-verify reads it, alone (no merge): its
    content runs to the end of its math span (the closing ``$``, ``\\)`` or ``\\]``, or the end of
    the line) when the box is inside one, else to the next space; trailing ``.``, ``,``, ``;``,
    ``:`` are dropped (:func:`_braceless_content`).

    Only the last ``MAX_TRAILING_BOXES`` boxes are looked at, and a response with more than
    ``MAX_ANSWER_BRACES`` braces from the first of them to its end has no readable answer
    (``None``), which bounds the event-loop cost on hostile input. A few linear passes over
    the text; no mathematics is parsed.

    Args:
        text: a model response.

    Returns:
        The answer (stripped contents; ``""`` for ``\\boxed{}``), or ``None`` when the text
        has no complete box (nor a brace-less last box with content).
    """
    fboxes = text.count("\\fbox")
    boxes = text.count("\\boxed") + fboxes
    if boxes == 0:
        return None
    last = max(text.rfind("\\boxed"), text.rfind("\\fbox")) if fboxes else text.rfind("\\boxed")
    # the common shape, a last ``\boxed{``, costs one ``startswith``; other shapes are checked for a
    # brace-less last box
    if (fboxes or not text.startswith("{", last + 6)) and _BOX_OPEN.match(text, last) is None:
        braceless = _BRACELESS_BOX.match(text, last)
        if braceless is not None:
            return _braceless_content(text, last, braceless.end())
    text = _answer_region(text, boxes)
    if text.count("{") + text.count("}") > MAX_ANSWER_BRACES:
        return None  # too complex to read on the event loop (MAX_ANSWER_BRACES)
    if boxes < 2:
        return last_boxed(text)  # one box: nothing to merge
    commands = [m.start() for m in _BOX_COMMAND.finditer(text)]
    closes = _box_closes(text)
    opens: list[int | None] = []  # per command: its opening brace, when the box is complete
    for start in commands:
        match = _BOX_OPEN.match(text, start)
        opens.append(match.end() - 1 if match is not None and match.end() - 1 in closes else None)
    complete = [(brace, i) for i, brace in enumerate(opens) if brace is not None]
    if not complete:
        return None
    last_brace, index = max(complete)  # the box opened last, as last_boxed
    parts = [text[last_brace + 1 : closes[last_brace]].strip()]
    later_start = commands[index]
    for earlier in range(index - 1, -1, -1):
        brace = opens[earlier]
        if brace is None or closes[brace] >= later_start:
            break  # unclosed, not followed by a brace, or enclosing the later box
        content = text[brace + 1 : closes[brace]].strip()
        between = text[closes[brace] + 1 : later_start]
        near = len(between) < _MERGE_NEAR_CHARS
        separated = (content != parts[-1] and len(between) < _MERGE_SEPARATED_CHARS
                     and _MERGE_SEPARATOR.search(between) is not None)
        if not (near or separated):
            break
        if content != parts[-1]:
            parts.append(content)
        later_start = commands[earlier]
    return _MERGE_JOIN.join(reversed(parts))


#: a box command not followed by a letter (``\\fboxsep`` is another command); tried only where
#: ``_BOX_OPEN`` (a brace) does not match; the match ends where the content starts
_BRACELESS_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])\s*")
#: where a brace-less box's content ends inside a math span, and outside one
_SPAN_END = re.compile(r"(?<!\\)\$|\\\)|\\\]|\n")
_TOKEN_END = re.compile(r"\s|(?<!\\)\$")
_TRAILING_PUNCTUATION = ".,;:"


def _braceless_content(text: str, command: int, start: int) -> str | None:
    """The answer of a brace-less last box (``\\boxed 7``) whose command starts at ``command``
    and whose content at ``start``: up to the end of its math span when the command is inside
    one (an odd number of ``$`` not written ``\\$`` before it, or an unclosed ``\\(``/``\\[``), else up
    to the next whitespace; trailing ``.,;:`` dropped; None when empty. math-verify 0.9 (its
    ``extract_boxed_content``) takes the rest of the math span it extracted, so ``$\\boxed 42$``
    is ``42`` for both. Linear, and only reached when the last box has no brace."""
    before = text[:command]
    in_math = ((before.count("$") - before.count("\\$")) % 2 == 1 or before.rfind("\\(") > before.rfind("\\)")
               or before.rfind("\\[") > before.rfind("\\]"))
    end = (_SPAN_END if in_math else _TOKEN_END).search(text, start)
    content = text[start : len(text) if end is None else end.start()].strip().rstrip(_TRAILING_PUNCTUATION).strip()
    return content or None


def _answer_region(text: str, boxes: int) -> str:
    """The text from the ``MAX_TRAILING_BOXES``-th last box command on (from the first box
    command when it has fewer boxes). Brace matching inside it is unaffected by what comes before: a brace's match
    depends only on the text after it. Found with C-level ``rfind``s, not a scan of every box."""
    if boxes <= MAX_TRAILING_BOXES:
        boxed, fbox = text.find("\\boxed"), text.find("\\fbox")
        start = fbox if boxed < 0 else boxed if fbox < 0 else min(boxed, fbox)
        return text[start:] if start >= 0 else text
    end = len(text)
    for _ in range(MAX_TRAILING_BOXES):
        end = max(text.rfind("\\boxed", 0, end), text.rfind("\\fbox", 0, end))
    return text[end:]


def _box_closes(text: str) -> dict[int, int]:
    """Opening brace -> matching closing brace, for every complete box (escapes skipped)."""
    box_opens = {m.end() - 1 for m in _BOX_OPEN.finditer(text)}
    closes: dict[int, int] = {}
    if not box_opens:
        return closes
    stack: list[int] = []
    # the regex skips ordinary characters in C; escape pairs (``\\{``, ``\\\\``) match as one token
    for match in _BRACE_TOKENS.finditer(text):
        token = match.group()
        if token == "{":
            stack.append(match.start())
        elif token == "}" and stack:
            opened = stack.pop()
            if opened in box_opens:
                closes[opened] = match.start()
    return closes


def normalize_critique(text: str) -> str:
    """A review's text for comparing reviews: case-folded, every whitespace run one space, stripped."""
    return " ".join(text.casefold().split())


def parse_verdict(text: str) -> Verdict | None:
    """The verifier's verdict: the last ``VERDICT: CORRECT`` / ``VERDICT: INCORRECT``.

    Case-insensitive; tolerates Markdown emphasis or quotes around the word
    (``VERDICT: **INCORRECT**``). Returns ``None`` when there is no verdict.
    """
    matches: list[str] = VERDICT_PATTERN.findall(text)
    if not matches:
        return None
    return "CORRECT" if matches[-1].upper() == "CORRECT" else "INCORRECT"


#: longest answer the event loop normalises or reads as a number; longer ones (up to the grader's
#: ``max_answer_chars``) go to a grading worker, which decides them by the same rules, so no
#: verdict changes (a 30 KB answer cost the loop about 1 ms in regex passes before)
LOOP_ANSWER_CHARS = 1024


def answer_key(answer: str) -> str:
    """What makes two answers "the same answer" for the repeated-answer rule: the normal form
    (:func:`normalize_answer`) up to ``LOOP_ANSWER_CHARS`` characters, the raw text beyond."""
    return normalize_answer(answer) if len(answer) <= LOOP_ANSWER_CHARS else answer


def normalize_answer(answer: str) -> str:
    """A conservative canonical form of a LaTeX answer, for exact comparisons only.

    Removes whitespace (except the space ending a control word before a letter), ``$``,
    ``\\left``/``\\right`` and LaTeX spacing commands, and maps
    ``\\dfrac``/``\\tfrac`` to ``\\frac``: rewrites that cannot change a value. Used to detect
    repeated answers and as the grader's exact fast path (equal normal forms are equivalent;
    different ones go to math-verify).
    """
    if len(answer) <= _CACHED_CHARS:
        return _normalize_cached(answer)
    return _normalize(answer)


#: answers up to this length have their normal form cached (gold answers recur on every turn)
_CACHED_CHARS = 256


def _normalize(answer: str) -> str:
    text = _NOISE.sub("", answer)
    text = _COMMAND_SPACE.sub("\\1\x00", text)  # ``\pi r`` must not become ``\pir``
    text = _SPACE.sub("", text).replace("\x00", " ")
    return _FRAC.sub(r"\\frac", text).rstrip(".")


_normalize_cached = lru_cache(maxsize=16384)(_normalize)
