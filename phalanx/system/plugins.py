"""User code named on the command line (model factories, the transfer function), imported by name.

Never evaluated: ``importlib`` and ``getattr`` only. The current directory comes first on the
search path, as ``python -m`` puts it, so ``phalanx train`` and the DDP workers of ``trainlaunch``
(started with ``python -m``) find a user's ``mymodel.py`` the same way. Standard library only.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

from ..errors import PhalanxError


def import_user_module(name: str, option: str) -> ModuleType:
    cwd = os.getcwd()
    if sys.path[:1] not in ([cwd], [""]):
        if cwd in sys.path:
            sys.path.remove(cwd)
        sys.path.insert(0, cwd)
    importlib.invalidate_caches()  # a module written after the last import attempt is found too
    try:
        return importlib.import_module(name)
    except Exception as exc:  # ImportError, or an error raised while importing the user's module
        top = name.split(".")[0]
        # The module itself not found (not a module it imports): say where phalanx looked.
        hint = (
            f"; phalanx looks in the current directory ({cwd}) and on PYTHONPATH: run from the folder that "
            f"holds {top}.py or {top}/, or add that folder to PYTHONPATH"
            if isinstance(exc, ModuleNotFoundError) and exc.name == top
            else ""
        )
        raise PhalanxError(f"cannot import module '{name}' ({type(exc).__name__}: {exc}){hint}", option) from None
