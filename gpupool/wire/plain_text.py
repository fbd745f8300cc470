"""Text that one user sets and another user's terminal shows: which characters are refused, and how to show the rest.

Why: a job's name, its labels and its reason are printed in other people's
``gpupool list`` and ``describe``. A control character there acts on the
reader's terminal instead of showing (ESC starts sequences that clear the
screen, set the window title or recolour text), and a bidi override or a line
separator makes a row say something other than what is stored. The service
refuses these characters in the fields a user sets for others to read
(:mod:`gpupool.service.validation`, and the HTTP schema through
:data:`PLAIN_TEXT_PATTERN`); the CLI escapes them in everything it prints
(:func:`escape`), because text stored before the rule, or coming from
elsewhere (a pod's status, a kubelet's message), never went through it.

One list of characters, here, so the refusal and the escaping cannot drift
apart. Only the standard library's builtins: the CLI's fast ``submit`` path
imports this module and must not pay for ``re``.
"""

from __future__ import annotations

# C0 controls, DEL and C1 controls (what terminals act on); the line and paragraph separators;
# the bidi marks, embeddings, overrides and isolates (what reorders a line on screen).
UNSAFE_RANGES: tuple[tuple[int, int], ...] = (
    (0x00, 0x1F), (0x7F, 0x9F), (0x061C, 0x061C), (0x200E, 0x200F), (0x2028, 0x2029), (0x202A, 0x202E),
    (0x2066, 0x2069),
)

_CLASS = "".join(f"\\u{lo:04x}" if lo == hi else f"\\u{lo:04x}-\\u{hi:04x}" for lo, hi in UNSAFE_RANGES)
PLAIN_TEXT_PATTERN = f"^[^{_CLASS}]*$"
"""A JSON Schema (and Python ``re``) pattern matching text with none of the unsafe characters."""

PLAIN_TEXT_RULE = "must not contain control characters, line separators or bidi direction marks"
"""The sentence every refusal of such text uses (after the field's name)."""

_ESCAPES: dict[int, str] = {
    code: (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
    for lo, hi in UNSAFE_RANGES for code in range(lo, hi + 1)
}


def escape(text: str) -> str:
    """``text`` with every unsafe character written as its escape (``\\x1b``, ``\\u202e``); the rest unchanged."""
    return text.translate(_ESCAPES)


def first_unsafe(text: str) -> int | None:
    """The index of the first unsafe character in ``text``, or None when there is none."""
    if text.isprintable() or escape(text) == text:  # every unsafe character is non-printable: one C pass
        return None
    return next(i for i, char in enumerate(text) if ord(char) in _ESCAPES)


def unsafe_problem(text: str) -> str | None:
    """``must not contain ... (found \\x1b at character 0)``, or None when ``text`` is plain."""
    where = first_unsafe(text)
    if where is None:
        return None
    return f"{PLAIN_TEXT_RULE} (found {_ESCAPES[ord(text[where])]} at character {where})"
