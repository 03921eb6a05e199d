"""Shared by the tests and the docstring examples."""

import tempfile

import pytest


@pytest.fixture(autouse=True)
def _examples_make_temporary_folders_in_pytests(request, tmp_path_factory, monkeypatch):
    """Docstring examples make their folders with ``tempfile.mkdtemp()``, as a reader would:
    here they go under pytest's own temporary folder, which pytest removes in time. (A short
    path: worker processes started by forkserver put their sockets under it.)"""
    if type(request.node).__name__ == "DoctestItem":
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path_factory.mktemp("example")))
