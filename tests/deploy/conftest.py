"""Collects validate_manifests.py, whose name pytest's default
test_*.py / *_test.py patterns do not match."""

import pytest


def pytest_collect_file(file_path, parent):
    # Named on the command line, pytest collects it already.
    if (file_path.name == "validate_manifests.py"
            and not parent.session.isinitpath(file_path)):
        return pytest.Module.from_parent(parent, path=file_path)
    return None
