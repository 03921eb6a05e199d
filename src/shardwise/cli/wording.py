"""Library messages in the command line's words: a hint to pass ``on_error='skip'`` becomes
``--on-error skip``, since that is what a user of the command can do."""

from __future__ import annotations

import re
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

# Keyword arguments whose hints the command line spells as flags: keyword -> flag.
FLAGS = {
    "on_error": "--on-error",
    "ids": "--ids",
    "delimiter": "--delimiter",
    "permutation": "--permutation",
    "remainder": "--remainder",
    "layout": "--layout",
}
_KEYWORD_VALUE = re.compile(rf"\b({'|'.join(FLAGS)})=(['\"])(.*?)\2")
_COLUMNS = re.compile(r"\bcolumns=\(([^)]*)\)")  # columns=('src', 'dst') -> --columns src,dst
# storage_options={'anon': True} -> --storage-option anon=true (one flag per option)
_STORAGE_OPTIONS = re.compile(r"\bstorage_options=\{([^}]*)\}")
_OPTION = re.compile(r"'([^']*)':\s*([^,]*)")
# Hints naming a keyword without a value, or one the command has no flag for: in its words.
_PHRASES = [
    (re.compile(r"(?<!-)\bcolumns=(?![(\w'\"])"), "--columns"),
    (re.compile(r"(?<!-)\bdelimiter must be"), "--delimiter must be"),
    (re.compile(r"\(storage_options\)"), "(--storage-option)"),
    (re.compile(r", or features=\)"), ")"),  # fvec's width comes from the first line
    (re.compile(r"; pass features= to say how many values every vector holds"),
     ": shardwise load takes the vectors' length from it (from Python, pass features=)"),
    (re.compile(r"use parser= for anything more complex"),
     "for anything more complex, load the files from Python with parser="),
]


def in_cli_words(message: str) -> str:
    """``message`` with each ``keyword='value'`` that has a flag written as ``--flag value``.

    >>> in_cli_words("id 'x' is not an integer (pass ids='str' for string ids)")
    "id 'x' is not an integer (pass --ids str for string ids)"
    >>> in_cli_words("name them: columns=('src', 'dst') or columns=('src', 'dst', 'weight')")
    'name them: --columns src,dst or --columns src,dst,weight'
    >>> in_cli_words("as storage_options={'key': ..., 'secret': ...} or storage_options={'anon': True}")
    'as --storage-option key=... --storage-option secret=... or --storage-option anon=true'
    """
    message = _STORAGE_OPTIONS.sub(lambda m: " ".join(
        f"--storage-option {key}={_json_word(value.strip())}"
        for key, value in _OPTION.findall(m.group(1))), message)
    for phrase, words in _PHRASES:
        message = phrase.sub(words, message)
    message = _COLUMNS.sub(lambda m: "--columns " + ",".join(
        name.strip(" '\"") for name in m.group(1).split(",")), message)
    return _KEYWORD_VALUE.sub(lambda m: f"{FLAGS[m.group(1)]} {m.group(3)}", message)


def _json_word(value: str) -> str:
    """A Python literal as ``--storage-option`` reads it (JSON): ``True`` is ``true``."""
    return {"True": "true", "False": "false", "None": "null"}.get(value, value)


@contextmanager
def warnings_in_cli_words(prog: str) -> Iterator[None]:
    """Show each warning as one line, ``PROG: warning: ...``, in the command line's words."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        print(f"{prog}: warning: {in_cli_words(str(message))}", file=file or sys.stderr)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield
