"""conftest.require: a test-only dependency that `make test` installs is imported, and a missing one fails the test
with how to install it (a skip would pass for a check that never ran)."""

from __future__ import annotations

import pytest

from conftest import require


def test_an_installed_dependency_is_imported():
    assert require("transformers").__name__ == "transformers"


def test_a_missing_dependency_fails_with_how_to_install_it():
    with pytest.raises(pytest.fail.Exception, match=r"graphex_no_such_module is not installed .*make test.* installs"):
        require("graphex_no_such_module")
