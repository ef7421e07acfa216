"""Text hygiene: character caps, control-text removal, terminal display, secret redaction.

Plain functions, no I/O. A child session's answer is untrusted: before it enters its parent's
context it goes through :func:`neutralise` (so it cannot forge chat-template structure or drive
a terminal) and :func:`cap_chars` (so it cannot crowd the parent's context). What loopd prints
to a terminal goes through :func:`escape_controls` (stored text stays as it was), and every
error text that could carry a credential goes through :func:`redact`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Final

__all__ = [
    "NEWLINE_MARK",
    "REDACTED",
    "TEMPLATE_TOKENS",
    "RedactFilter",
    "cap_chars",
    "escape_controls",
    "neutralise",
    "redact",
]

TEMPLATE_TOKENS: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        # Tokens of the ``<|name|>`` shape (ChatML, Llama 3, Phi; DeepSeek's with fullwidth bars,
        # U+FF5C) are removed by the general pattern below whatever the name; listed as examples.
        "chatml": ("<|im_start|>", "<|im_end|>", "<|im_sep|>", "<|endoftext|>"),
        "llama3": ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        "phi": ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>"),
        "deepseek": (
            "<\uff5cbegin▁of▁sentence\uff5c>",
            "<\uff5cUser\uff5c>",
            "<\uff5cAssistant\uff5c>",
            "<\uff5cend▁of▁sentence\uff5c>",
        ),
        # Families whose tokens have no common shape: matched literally, case-insensitively.
        "llama2": ("[INST]", "[/INST]", "<<SYS>>", "<</SYS>>", "<s>", "</s>"),
        "mistral": (
            "[TOOL_CALLS]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
            "[SYSTEM_PROMPT]",
            "[/SYSTEM_PROMPT]",
        ),
        "gemma": ("<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>"),
        "tools": ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"),
    }
)
"""Special tokens of the common chat-template families, by family; all are removed."""

# ``<|name|>`` with ASCII or fullwidth (U+FF5C) bars. The name has at most 64 characters (real
# ones have far fewer) and no whitespace or angle brackets, so ``a < b``, ``<b>``, ``<|>`` and
# F#'s ``x |> f <| y`` are left alone.
_NAME_MAX = 64
_BARRED = rf"<[|\uff5c][^<>\s]{{0,{_NAME_MAX}}}?[|\uff5c]>"
_LITERALS = sorted({t for ts in TEMPLATE_TOKENS.values() for t in ts}, key=len, reverse=True)
_TOKEN = rf"{_BARRED}|{'|'.join(re.escape(t) for t in _LITERALS)}"
_TOKENS = re.compile(_TOKEN, re.IGNORECASE)
_TOKEN_AT_END = re.compile(rf"(?:{_TOKEN})\Z", re.IGNORECASE)
_TOKEN_LEN_MAX = max(_NAME_MAX + 4, len(_LITERALS[0]))
_TOKEN_ENDS = re.compile(f"([{re.escape(''.join({t[-1] for t in _LITERALS} | {'>'}))}])")

# Terminal escape sequences, removed whole. String sequences (OSC, DCS, SOS, PM, APC; 7-bit
# ``ESC ]`` etc. or their 8-bit C1 forms) run to BEL or ST; CSI to its final byte; any other
# ESC sequence is ESC, intermediates, one final byte. What is left of a malformed one loses its
# ESC (or C1 introducer) to the control pass below; its other characters stay as text.
_ANSI = re.compile(
    r"(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)"
    r"|(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|\x1b[ -/]*[0-~]"
)

# C0 controls but ``\t`` and ``\n``, DEL, C1 controls.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def cap_chars(s: str, n: int) -> str:
    """Return at most the first ``n`` characters (code points) of ``s``.

    Python strings are sequences of code points, so the cut always falls on a character
    boundary (never inside a multi-byte UTF-8 sequence). ``n < 0`` raises ``ValueError``.
    """
    if n < 0:
        raise ValueError(f"cap_chars: n must be >= 0, got {n}")
    return s[:n]


def _strip_tokens(text: str) -> str:
    # One pass with a stack, so that nesting cannot defeat it: characters go onto ``out``, and
    # whenever one that can end a token arrives, a token ending there is taken off again. ``out``
    # never holds a token, so no token is left, however the pieces were interleaved.
    if not _TOKENS.search(text):
        return text
    out: list[str] = []
    for i, piece in enumerate(_TOKEN_ENDS.split(text)):
        out.extend(piece)
        if i % 2:  # a token-ending character
            tail = "".join(out[-_TOKEN_LEN_MAX:])
            found = _TOKEN_AT_END.search(tail)
            if found:
                del out[len(out) - (len(tail) - found.start()) :]
    return "".join(out)


def neutralise(text: str) -> str:
    """Remove chat-template control text and terminal control from untrusted ``text``.

    Removed: special tokens of the common template families (:data:`TEMPLATE_TOKENS`, and any
    ``<|name|>`` token, with ASCII or fullwidth bars), terminal escape sequences (whole), and
    every C0 control but ``\\n`` and ``\\t``, DEL and the C1 controls. Everything else is kept.

    Escape sequences go first, then controls (so they cannot hide a token), then tokens, in
    one pass that nesting cannot defeat (``<|im_<|im_start|>start|>`` leaves nothing). The
    result holds none of these, so ``neutralise(neutralise(t)) == neutralise(t)``.
    """
    return _strip_tokens(_CONTROLS.sub("", _ANSI.sub("", text)))


# What a terminal may act on: C0 controls but ``\n`` and ``\t``, DEL, C1 controls, and lone
# surrogates (which cannot even be encoded for the terminal). ``\t`` joins the set for one-line
# displays, and a line break (``\n`` or ``\r\n``) becomes :data:`NEWLINE_MARK` there.
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
_UNSAFE_ONE_LINE = re.compile(r"\r?\n|[\x00-\x1f\x7f-\x9f\ud800-\udfff]")

NEWLINE_MARK = "⏎"
"""What a line break of the text shows as in a one-line display (an event line, the ``✎`` line
of a streamed answer): readable as a line break, and still one line."""


def _escaped(found: re.Match[str]) -> str:
    text = found.group()
    if text.endswith("\n"):
        return NEWLINE_MARK
    code = ord(text)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str, *, one_line: bool = False) -> str:
    """``text`` made safe to print to a terminal: every control character shown escaped.

    C0 controls (but ``\\n`` and ``\\t``), DEL, C1 controls and lone surrogates become
    ``\\xNN`` (``\\uNNNN`` for a surrogate), so ``ESC ] 0 ; x BEL`` prints as the visible text
    ``\\x1b]0;x\\x07`` instead of retitling the window. With ``one_line``, ``\\t`` is escaped
    too and a line break (``\\n``, ``\\r\\n``) shows as :data:`NEWLINE_MARK` (``⏎``), never as
    ``\\x0a``. Everything else is kept; the text a store holds is never changed.
    """
    pattern = _UNSAFE_ONE_LINE if one_line else _UNSAFE
    return pattern.sub(_escaped, text)


REDACTED = "[redacted]"
"""What :func:`redact` puts where a secret was."""

# ``scheme://user:password@host`` or ``scheme://token@host``: the userinfo goes.
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#@\s]*@")
# ``Bearer <token>`` / ``Basic <token>`` (RFC 6750's token characters), as a header echoed in
# an error text.
_AUTH_HEADER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+")


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every credential replaced by :data:`REDACTED`.

    Gone: each of ``secrets`` wherever it occurs (the API key, say), the userinfo of any URL
    (``http://user:secret@host`` → ``http://[redacted]@host``) and the token after ``Bearer`` or
    ``Basic``. Apply it to every text that leaves loopd (error details, events, logs, the CLI).
    """
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    text = _URL_USERINFO.sub(rf"\1{REDACTED}@", text)
    return _AUTH_HEADER.sub(rf"\1 {REDACTED}", text)


class RedactFilter(logging.Filter):
    """A logging filter that passes :func:`redact` over every record's text.

    loopd redacts its own texts where they are made; this is for the loggers of the libraries
    it drives (httpx logs each request's URL, credentials included).
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets = tuple(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        clean = redact(text, self.secrets)
        if clean != text:
            record.msg, record.args = clean, None
        return True
