"""The training frameworks klserve.jax and klserve.torch wrap, which the
client installs without."""

import importlib
from types import ModuleType


def import_framework(module: str, name: str) -> ModuleType:
    """`module` imported; when it is not installed, an ImportError that says
    which extra of the client brings it. A framework that is installed but
    fails to import (a jaxlib that does not match, CUDA libraries missing)
    keeps its own error, which says why."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        raise ImportError(
            "klserve.%s needs %s, which is not installed: install the client "
            "with its %s extra (pip install './client/python[%s]' from the "
            "repository), or %s itself" % (module, name, module, module,
                                           name)) from e
