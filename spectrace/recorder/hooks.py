"""Installing and removing wrappers around vLLM callables.

A :class:`Hook` names its target as ``"module:Qualified.name"``; which versions
it fits is data in :mod:`spectrace.recorder.support`. Installing checks that the
target exists in the installed vLLM (a missing one: ``missing``) and that the
installed version and the site's source fit the hook (else ``unsupported``);
either is reported (one log line + a ``hooks`` row), never silently skipped,
and the other hooks go on. A site the installed vLLM removed on purpose (the V1
model runner's, from 0.34) is ``retired``: a ``hooks`` row, no warning. On a vLLM
newer than the tested range a hook whose site fits installs, its row noting so
(``untested``). The process's one start-up line (:meth:`HookSet.summary`) counts them all. Every installed hook can be removed again, leaving the
original object in place (tests check identity).

Wrappers are built by a factory ``make(original, name) -> wrapper`` (``name`` is the
hook's, which its errors are counted under and ``SPECTRACE_INJECT_FAULT`` names). A
wrapper calls the original exactly once with the caller's arguments and returns its
result or raises its exception unchanged; spectrace's own work inside it runs under
:func:`spectrace.recorder.runtime.guard` (or, on the per-step hot path, the same
try/except inline).
"""

from __future__ import annotations

import functools
import importlib
import logging
import sys
from dataclasses import dataclass
from typing import Any, Callable

from spectrace.recorder import support

log = logging.getLogger("vllm.spectrace")


@dataclass(frozen=True)
class Hook:
    name: str
    target: str  # "package.module:Class.method" or "package.module:function"
    make: Callable[[Callable[..., Any], str], Callable[..., Any]]  # which versions it fits: support.SUPPORT
    # a module-level function patched in the namespace of the code that calls it (``from x import f`` there):
    # "module:Name" of that caller; the name is patched in the module that *defines* the caller, so a shim left
    # at the old path (vLLM's main moves modules under ``vllm/foundation/...``) still patches the name it calls
    within: str = ""
    # installed only once the process shows it is the hook's (``later``: an API server's hook, installed when its
    # AsyncLLM is up, ``spectrace.recorder.frontend``); until then ``elsewhere`` (a row, no warning), and its site's
    # module is never imported (the chat server's costs ~0.4 s in every engine core and worker)
    later: str = ""

    @property
    def module(self) -> str:
        return self.target.split(":", 1)[0]

    @property
    def path(self) -> list[str]:
        return self.target.split(":", 1)[1].split(".")


@dataclass
class Installed:
    hook: Hook
    owner: Any
    attr: str
    original: Any  # the raw attribute as found in owner.__dict__ (or None)
    had_own: bool


class MissingTarget(Exception):
    pass


def _import(module_name: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except Exception as exc:
        raise MissingTarget(f"module {module_name} cannot be imported: {exc}") from None


def resolve(target: str, within: str = "") -> tuple[Any, str, Any]:
    """Return (owner, attribute name, current value) for ``target``.

    A class or method is the same object through any module that re-exports it. A module-level function given
    ``within`` (its caller, ``Hook.within``) is looked up in the module that defines that caller."""
    module_name, _, qualname = target.partition(":")
    owner: Any = _import(module_name)
    if within and "." not in qualname:
        caller_module, _, caller_name = within.partition(":")
        caller = getattr(_import(caller_module), caller_name, None)
        defining = sys.modules.get(getattr(caller, "__module__", "") or "")
        if defining is None:
            raise MissingTarget(f"{caller_module} has no {caller_name} (the caller of {qualname})")
        if not hasattr(defining, qualname):
            raise MissingTarget(f"{defining.__name__} (where {caller_name} is defined) calls no {qualname}")
        return defining, qualname, getattr(defining, qualname)
    parts = qualname.split(".")
    for part in parts[:-1]:
        if not hasattr(owner, part):
            raise MissingTarget(f"{module_name} has no {part}")
        owner = getattr(owner, part)
    attr = parts[-1]
    if not hasattr(owner, attr):
        raise MissingTarget(f"{module_name}:{'.'.join(parts[:-1]) or '<module>'} has no {attr}")
    return owner, attr, getattr(owner, attr)


class HookSet:
    """The hooks installed in this process."""

    def __init__(self) -> None:
        self.installed: dict[str, Installed] = {}
        self.missing: dict[str, str] = {}
        self.unsupported: dict[str, str] = {}
        self.retired: dict[str, str] = {}
        self.untested: dict[str, str] = {}  # installed outside the tested range: the note
        self.elsewhere: dict[str, str] = {}  # a ``Hook.later`` not installed (yet): another process's hook

    def status(self, name: str) -> str:
        """``installed``, ``retired``, ``elsewhere``, ``unsupported`` or ``missing`` (a hook not tried: ``missing``)."""
        if name in self.installed:
            return "installed"
        if name in self.retired:
            return "retired"
        if name in self.elsewhere:
            return "elsewhere"
        return "unsupported" if name in self.unsupported else "missing"

    def summary(self) -> str:
        """The start-up line's count: hooks active of those this vLLM has, and why the others are not."""
        active = len(self.installed)
        failed = {**self.missing, **self.unsupported}
        text = f"{active} of {active + len(failed)} hooks active"
        if self.retired:
            text += f" ({len(self.retired)} retired: not in this vLLM by design)"
        if self.untested:
            text += f"; {len(self.untested)} installed outside the tested range (their sites fit)"
        if failed:
            text += "; not installed: " + "; ".join(f"{name} ({why})" for name, why in sorted(failed.items()))
        return text

    def install(self, hook: Hook, now: bool = False) -> str | None:
        """Install ``hook``; return None on success, else why it is missing, unsupported, retired or elsewhere
        (``now``: a ``later`` hook's process has shown it is its own)."""
        if hook.name in self.installed:
            return None
        gone = support.retired(hook.name)
        if gone is not None:
            self.retired[hook.name] = gone
            return gone
        if hook.later and not now:
            why = self.elsewhere[hook.name] = f"not this process's yet: installed {hook.later}"
            return why
        self.elsewhere.pop(hook.name, None)
        try:
            owner, attr, current = resolve(hook.target, hook.within)
        except MissingTarget as exc:
            reason = str(exc)
            self.missing[hook.name] = reason
            log.warning(
                "spectrace: hook %s not installed: %s (written for %s); "
                "that part of the audit is unavailable",
                hook.name,
                reason,
                support.range_text(hook.name),
            )
            return reason
        try:
            unfit = support.check(hook.name, hook.target, current)
        except Exception as exc:  # a check that cannot decide never installs blind
            unfit = f"support check failed: {type(exc).__name__}: {exc}"
        if unfit is not None:
            self.unsupported[hook.name] = unfit
            log.warning(
                "spectrace: hook %s switched off: %s (supports %s); that part of the audit is unavailable",
                hook.name,
                unfit,
                support.range_text(hook.name),
            )
            return unfit
        raw = owner.__dict__.get(attr) if isinstance(owner, type) else current
        had_own = isinstance(owner, type) and attr in owner.__dict__
        if isinstance(raw, staticmethod):
            replacement: Any = staticmethod(functools.wraps(raw.__func__)(hook.make(raw.__func__, hook.name)))
        elif isinstance(raw, classmethod):
            replacement = classmethod(functools.wraps(raw.__func__)(hook.make(raw.__func__, hook.name)))
        else:
            replacement = functools.wraps(current)(hook.make(current, hook.name))
        setattr(owner, attr, replacement)
        self.installed[hook.name] = Installed(hook, owner, attr, raw, had_own)
        note = support.untested(hook.name)
        if note is not None:
            self.untested[hook.name] = note
        return None

    def uninstall_all(self) -> None:
        for name in list(self.installed):
            entry = self.installed.pop(name)
            if isinstance(entry.owner, type) and not entry.had_own:
                delattr(entry.owner, entry.attr)
            else:
                setattr(entry.owner, entry.attr, entry.original)
