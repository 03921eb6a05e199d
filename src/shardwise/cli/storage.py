"""``--storage-option KEY=VALUE``: fsspec options for URLs, shared by ``shardwise load`` and
``shardwise plan``. Values may be credentials: no message ever repeats one."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

# fsspec's option names are Python keywords in lower case (endpoint_url, client_kwargs); nested
# ones go in a JSON value. A secret holding '=' (base64's padding) is no such name, so it is
# refused rather than passed on as a keyword that the filesystem's error would quote.
_OPTION_NAME = re.compile(r"[a-z_][a-z0-9_]*")


def add_storage_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--storage-option KEY=VALUE`` (repeatable) to ``parser``, as ``storage_options``."""
    parser.add_argument(
        "--storage-option", metavar="KEY=VALUE", type=storage_option, action="append",
        default=[], dest="storage_options",
        help="an fsspec option for URLs (s3://, gs://, az://, http(s)://), such as "
             "endpoint_url=http://127.0.0.1:9000 or anon=true; repeat it for each option. VALUE "
             "is read as JSON where it is JSON (true, 8, {\"region_name\": \"eu-west-1\"}), else "
             "as text. Credentials are best left to the environment (AWS_ACCESS_KEY_ID...)",
    )


def storage_option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` as a pair, VALUE read as JSON where it is JSON, else kept as text.

    KEY must read as an option's name. Errors never repeat the text: it may be a secret.

    >>> storage_option("anon=true"), storage_option("endpoint_url=http://127.0.0.1:9000")
    (('anon', True), ('endpoint_url', 'http://127.0.0.1:9000'))
    """
    key, equals, value = text.partition("=")
    key = key.strip()
    if not (equals and _OPTION_NAME.fullmatch(key)):
        raise argparse.ArgumentTypeError(
            "expected KEY=VALUE, KEY an fsspec option's name in lower case, such as "
            "endpoint_url=http://127.0.0.1:9000 (what was given is not repeated here, as it may "
            "be a credential)")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def storage_options(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """The options of the flags given, each key once.

    >>> storage_options([("anon", True), ("endpoint_url", "http://127.0.0.1:9000")])
    {'anon': True, 'endpoint_url': 'http://127.0.0.1:9000'}
    """
    keys = [key for key, _ in pairs]
    twice = sorted({key for key in keys if keys.count(key) > 1})
    if twice:
        raise ValueError(f"--storage-option {', '.join(twice)} is given more than once: give "
                         "each option once")
    return dict(pairs)
