"""The recorder's old name (``spectrace.recorder`` since issue 56): ``spectrace.tracer.X`` is ``spectrace.recorder.X``,
the same module object, for code outside the package that still names it (tools/, scripts of results recorded
before the move). Nothing in the package imports it."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

_OLD, _NEW = "spectrace.tracer.", "spectrace.recorder."


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(_OLD):
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(_NEW + spec.name[len(_OLD):])  # the module itself, under both names

    def exec_module(self, module) -> None:
        pass  # already executed under its own name


if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
    sys.meta_path.insert(0, _Alias())


def __getattr__(name: str):
    return importlib.import_module(_NEW + name)
