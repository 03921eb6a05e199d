"""Keep credentials out of every message: what storage options and URLs carry may be secret.

An object store's error may quote the request's URL (a presigned query string, a password) or an
option's value. So shardwise names a remote file by its public URL (password and query values
shown as ``***``), and before it words an error that quotes a filesystem's own message it
replaces every secret it was given with ``***``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl, quote, quote_plus, urlsplit, urlunsplit

HIDDEN = "***"
# Option names whose values are credentials (s3fs key/secret/token, adlfs account_key/sas_token/
# connection_string, gcsfs token, an Authorization header...), matched anywhere in the name.
_SECRET_NAME = re.compile(
    r"key|secret|token|passw|credential|auth|signature|sas|cookie|session|conn(?:ection)?_str",
    re.IGNORECASE)
_NAMED_PART = re.compile(r"([^;&=\s]+)=([^;&\s]+)")  # NAME=value in a query or a form's body
# NAME=value in a connection string, the value up to the next ';': a SharedAccessSignature's holds
# '&' and '=' (sv=...&sig=...), an AccountKey's ends in '='.
_CONNECTION_PART = re.compile(r"([^;=\s]+)=([^;]+)")
# A URL's password: from the first ':' after the user to the last '@' before the query. It may
# hold '/' (AWS secret keys do), where urlsplit would end the host, and '@'. Digits ending at
# '/' are a port (http://127.0.0.1:9000/a@b.csv has no password).
_PASSWORD = re.compile(r"[^:/?#]+://[^/?#:\[\]]*:(?!\d{1,5}(?:[/?#]|$))([^?#]*)@")
# Shorter values would blank out ordinary words in messages, and protect nothing anyway.
_SHORTEST_SECRET = 4


def public_url(url: str) -> str:
    """``url`` as it may be shown: its password and the values of its query shown as ``***``.

    >>> public_url("https://me:pw@host/a.csv?X-Amz-Signature=abc&v=1")
    'https://me:***@host/a.csv?X-Amz-Signature=***&v=***'
    >>> public_url("s3://KEY:se/cret@bucket/a.csv"), public_url("data/a.csv")
    ('s3://KEY:***@bucket/a.csv', 'data/a.csv')
    """
    if "://" not in url:
        return url
    password = _PASSWORD.match(url)
    if password:
        url = f"{url[:password.start(1)]}{HIDDEN}{url[password.end(1):]}"
    parts = urlsplit(url)
    query = "&".join(f"{name}={HIDDEN}" if equals else name
                     for name, equals, _ in (item.partition("=") for item in parts.query.split("&"))
                     ) if parts.query else ""
    return urlunsplit(parts._replace(query=query))


def secrets_in(url: str, storage_options: Mapping[str, Any]) -> frozenset[str]:
    """The secret values ``url`` and ``storage_options`` hold.

    A URL's password and query values; every value, at any depth, of an option whose name reads
    like a credential (``key``, ``secret``, ``token``, ``password``, ``account_key``,
    ``connection_string``, a header ``Authorization``...); and each ``NAME=value`` part of any
    option whose ``NAME`` does (an Azure connection string's ``AccountKey=...``, its whole
    ``SharedAccessSignature=...`` and that query's values).

    >>> sorted(secrets_in("https://host/a?sig=s1gn", {"key": "k3y1", "client_kwargs": {
    ...     "endpoint_url": "http://127.0.0.1:9000", "aws_secret_access_key": "s3cr3t"}}))
    ['k3y1', 's1gn', 's3cr3t']
    """
    found: set[str] = set()
    if "://" in url:
        found.update(_query_values(urlsplit(url).query))
        password = _PASSWORD.match(url)
        if password:
            # A filesystem reads its '/' as a path's and may quote either side (a bucket name).
            found.update({password[1], *password[1].split("/")})

    def visit(name: str, value: Any, secret: bool) -> None:
        secret = secret or bool(_SECRET_NAME.search(name))
        if isinstance(value, Mapping):
            for key, item in value.items():
                visit(str(key), item, secret)
        elif isinstance(value, (list, tuple, set, frozenset)):
            for item in value:
                visit(name, item, secret)
        elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
            if secret:
                found.add(str(value))
            if isinstance(value, str):
                found.update(part for key, part in _NAMED_PART.findall(value)
                             if _SECRET_NAME.search(key))
                for key, part in _CONNECTION_PART.findall(value):
                    if _SECRET_NAME.search(key):  # whole, and each value of a signature's query
                        found.update({part.strip(), *_query_values(part.strip())})

    visit("", storage_options, False)
    return frozenset(value for value in found if len(value) >= _SHORTEST_SECRET)


def _query_values(query: str) -> set[str]:
    """The values of ``query``'s ``NAME=value`` items, decoded and as written."""
    return ({value for _, value in parse_qsl(query)}
            | {item.partition("=")[2] for item in query.split("&")})


def hide(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each secret, as given or URL-quoted, replaced by ``***``.

    >>> hide("403 for https://host/a?sig=ab%2Fc%3D", {"ab/c="})
    '403 for https://host/a?sig=***'
    """
    # Longest first: a secret that holds a shorter one is hidden whole.
    for secret in sorted(secrets, key=len, reverse=True):
        for spelling in {secret, quote(secret, safe=""), quote_plus(secret, safe="")}:
            text = text.replace(spelling, HIDDEN)
    return text
