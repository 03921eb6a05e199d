"""Shared by the tests and the docstring examples."""

import tempfile

import pytest


@pytest.fixture(autouse=True)
def _temporary_files_in_pytests_folder(tmp_path, monkeypatch):
    """Examples make their folders with ``tempfile.mkdtemp()``, as a reader would: here they go
    under the test's own temporary folder, which pytest removes in time."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
