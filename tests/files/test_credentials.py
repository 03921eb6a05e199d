"""Credentials in URLs and storage options are found, and hidden from every message."""

from __future__ import annotations

import argparse

import pytest

from shardwise.cli import main
from shardwise.cli.storage import storage_option
from shardwise.files import plan
from shardwise.files.credentials import HIDDEN, hide, public_url, secrets_in


@pytest.mark.parametrize("url, shown", [
    ("https://me:pa55word@host:8080/a.csv", "https://me:***@host:8080/a.csv"),
    ("https://host/a.csv?X-Amz-Credential=AKIA1%2F2&X-Amz-Signature=f00d&flag",
     "https://host/a.csv?X-Amz-Credential=***&X-Amz-Signature=***&flag"),
    ("az://container/a.csv", "az://container/a.csv"),
    # A password may hold '/' (AWS secret keys do) or '@': hidden up to the last '@'.
    ("s3://AKIAKEYID:wJal/K7MD+bPx@bucket/t/a.csv", "s3://AKIAKEYID:***@bucket/t/a.csv"),
    ("ftp://me@example.com:p@ss/w0rd@host/a.csv?v=1", "ftp://me@example.com:***@host/a.csv?v=***"),
    # A port is no password, though a '@' follows in the path.
    ("http://127.0.0.1:9000/bucket/me@example.com.csv",
     "http://127.0.0.1:9000/bucket/me@example.com.csv"),
    ("https://[::1]:8080/a@b.csv", "https://[::1]:8080/a@b.csv"),
    ("data/a?b.csv", "data/a?b.csv"),  # a local name is never a URL, whatever it holds
])
def test_public_url_hides_passwords_and_query_values(url: str, shown: str) -> None:
    assert public_url(url) == shown


def test_secrets_are_found_by_name_at_any_depth_and_inside_connection_strings() -> None:
    options = {
        "key": "AKIAEXAMPLEKEY", "anon": False, "default_block_size": 2**20,
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1",
                          "headers": {"Authorization": "Bearer t0ken-value"}},
        "connection_string": "AccountName=acct;AccountKey=base64key==;EndpointSuffix=x.net",
        "token": {"private_key": "-----BEGIN KEY-----abc", "client_email": "me@example.com"},
        "session_token": 123456,
    }
    found = secrets_in("https://u:pw-1234@host/a?sig=s%2Bgn", options)
    assert found >= {"AKIAEXAMPLEKEY", "Bearer t0ken-value", "base64key==", "me@example.com",
                     "-----BEGIN KEY-----abc", "123456", "pw-1234", "s+gn", "s%2Bgn"}
    # What is not a credential stays readable in messages; so do values too short to protect
    # anything, which would blank out words.
    assert not found & {"http://127.0.0.1:9000", "eu-west-1", "acct", "x.net", str(2**20)}
    assert secrets_in("s3://bucket/a.csv", {"key": "ab"}) == frozenset()


def test_a_connection_strings_shared_access_signature_is_hidden_whole_and_by_its_values() -> None:
    signature = ("sv=2022-11-02&ss=b&srt=co&sp=rl&se=2030-01-01T00:00:00Z"
                 "&sig=AbCdEfSecretSig%2B%3D")
    string = ("BlobEndpoint=https://acct.blob.core.windows.net/;"
              f"SharedAccessSignature={signature};AccountKey=base64key==")
    found = secrets_in("az://container/x.csv", {"connection_string": string})
    assert found >= {string, signature, "base64key==", "AbCdEfSecretSig%2B%3D"}
    message = hide(f"bad connection string {string!r}; 403 for "
                   "https://acct.blob.core.windows.net/container?sig=AbCdEfSecretSig%2B%3D&sv=1",
                   found)
    assert "AbCdEfSecretSig" not in message and "base64key" not in message
    assert "https://acct.blob.core.windows.net/container" in message


def test_a_password_holding_a_slash_is_found_whole_and_by_its_parts() -> None:
    # s3fs reads "AKIAKEYID:wJal" as the bucket, and botocore's error quotes it.
    assert secrets_in("s3://AKIAKEYID:wJal/K7MD+bPx@bucket/t/", {}) == {
        "wJal/K7MD+bPx", "wJal", "K7MD+bPx"}
    assert secrets_in("http://127.0.0.1:9000/bucket/me@example.com.csv", {}) == frozenset()


def test_the_command_never_shows_a_url_password_holding_a_slash(capsys) -> None:
    secret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
    with pytest.raises(SystemExit) as exit_code:  # the bucket name s3fs reads is refused at once
        main(["plan", f"s3://AKIAKEYID:{secret}@bucket/t/",
              "--storage-option", "endpoint_url=http://127.0.0.1:9"])
    assert exit_code.value.code == 2
    printed = capsys.readouterr()
    assert "s3://AKIAKEYID:***@bucket/t/" in printed.err
    for part in secret.split("/"):
        assert part not in printed.out + printed.err


def test_hide_replaces_each_secret_as_written_or_url_quoted() -> None:
    secrets = {"Bearer t0k/+=", "t0k/"}
    text = "denied for Bearer t0k/+= (Bearer%20t0k%2F%2B%3D, Bearer+t0k%2F%2B%3D) and t0k/"
    assert hide(text, secrets) == f"denied for {HIDDEN} ({HIDDEN}, {HIDDEN}) and {HIDDEN}"


def test_storage_options_must_be_a_mapping(tmp_path) -> None:
    (tmp_path / "a.txt").write_text("1,2\n")
    with pytest.raises(TypeError, match="storage_options must be a dict of fsspec options"):
        plan(tmp_path, 1, storage_options=["key=value"])


def test_storage_option_flags_are_parsed_without_echoing_values() -> None:
    assert storage_option('client_kwargs={"region_name": "eu-west-1"}') == (
        "client_kwargs", {"region_name": "eu-west-1"})
    assert storage_option("secret=abc=def") == ("secret", "abc=def")
    assert storage_option(" s3_additional_kwargs ={}") == ("s3_additional_kwargs", {})
    with pytest.raises(argparse.ArgumentTypeError) as caught:
        storage_option("AKIAONLYAVALUE")
    assert "AKIAONLYAVALUE" not in str(caught.value)


def test_the_command_never_echoes_a_bad_storage_option(capsys) -> None:
    with pytest.raises(SystemExit) as exit_code:
        main(["load", "data/", "--storage-option", "AKIAONLYAVALUE"])
    assert exit_code.value.code == 2
    err = capsys.readouterr().err
    assert "--storage-option: expected KEY=VALUE" in err and "AKIAONLYAVALUE" not in err


@pytest.mark.parametrize("text", [
    "c2VjcmV0LXNlc3Npb24tdG9rZW4tZm9yLXJlcHJv==",  # a base64 secret, padded with '='
    "wJalrXUtnFEMI/K7MDENG+bPxRfiCY=EXAMPLEKEY", "=AKIAONLYAVALUE", "Secret=AKIAONLYAVALUE",
])
def test_a_storage_option_whose_key_is_no_option_name_is_refused_unrepeated(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected KEY=VALUE") as caught:
        storage_option(text)
    assert all(part not in str(caught.value) for part in text.split("=") if part)


def test_the_command_never_echoes_a_secret_that_holds_an_equals_sign(capsys) -> None:
    secret = "c2VjcmV0LXNlc3Npb24tdG9rZW4tZm9yLXJlcHJv=="
    with pytest.raises(SystemExit) as exit_code:
        main(["plan", "s3://bucket/t/", "--storage-option", secret])
    assert exit_code.value.code == 2
    printed = capsys.readouterr()
    assert "--storage-option: expected KEY=VALUE" in printed.err
    assert secret.rstrip("=") not in printed.out + printed.err


def test_the_command_refuses_an_option_given_twice(tmp_path, capsys) -> None:
    (tmp_path / "a.txt").write_text("1,2\n")
    with pytest.raises(SystemExit):
        main(["load", str(tmp_path), "--storage-option", "key=AKIAONE",
              "--storage-option", "key=AKIATWO"])
    err = capsys.readouterr().err
    assert "--storage-option key is given more than once" in err
    assert "AKIAONE" not in err and "AKIATWO" not in err
