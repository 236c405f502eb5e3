"""A training process's start-up without ``torch._dynamo``, for scripts that never compile.

torch wraps many of its own functions with ``torch._compile._disable_dynamo`` (the
optimizer's ``add_param_group``, ``zero_grad``, ``state_dict``; DDP's methods; 288 functions in
torch 2.13), so that a compiled caller does not trace into them. The wrapper imports
``torch._dynamo`` at its first call, to build the disabled function it then caches on the
wrapped one as ``__dynamo_disable``. That import is the largest part of a joiner's start-up:
1.6 s of a 3.1-s start on the 2-core CPU nodes, 5.6 s of 9.4 s on an H100 node, in a process
that builds ``torch.optim.SGD`` and compiles nothing.

Two more places import it on a joiner's way to its first step: every optimizer's ``step``
(torch's ``_use_grad_for_differentiable`` wrapper calls ``torch._dynamo.graph_break()``, which
does nothing outside a compiled frame) and DDP's constructor (it asks dynamo's config which
reducer a *compiled* DDP uses).

Until ``torch._dynamo`` is imported nothing can be compiled, so disabling dynamo for a call is
calling the function, a graph break is nothing, and dynamo's config holds its defaults.
:func:`defer_dynamo` relies on exactly that and nothing more:

* on every function torch wrapped with ``_disable_dynamo``, it caches a stand-in that calls the
  function while ``torch._dynamo`` is not loaded; the first call after it is loaded builds
  torch's own disabled function and puts it in place, and once the import has completed every
  stand-in left is removed, so from then on torch's own wrapper runs as if nothing was done;
* each torch optimizer's ``step`` runs torch's wrapper once ``torch._dynamo`` is loaded, and
  before that the same wrapper less its two graph breaks (the grad mode set and restored);
* :func:`ddp_without_dynamo` builds a DDP while ``torch._dynamo`` is not loaded with dynamo's
  default answer (``Elastic`` uses it; any other use of dynamo there imports it as before).

``MALLETRAIN_DEFER_DYNAMO=0`` turns all of it off. Measured in BENCHMARKS.md (joiner start-up).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib.abc
import importlib.util
import os
import sys
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

ENV_DEFER = "MALLETRAIN_DEFER_DYNAMO"
DYNAMO = "torch._dynamo"
CACHE_ATTR = "__dynamo_disable"   # the attribute torch's wrapper caches its function on

_lock = threading.Lock()
_deferred: list[Callable[..., Any]] = []   # wrapped functions that hold a stand-in
_installed = False


class _Plain:
    """Stands in for ``torch._dynamo.disable(fn)`` while ``torch._dynamo`` is not loaded."""

    __slots__ = ("fn", "recursive")

    def __init__(self, fn: Callable[..., Any], recursive: bool) -> None:
        self.fn, self.recursive = fn, recursive

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if DYNAMO not in sys.modules:
            return self.fn(*args, **kwargs)
        import torch._dynamo  # waits for an import in progress in another thread

        real = torch._dynamo.disable(self.fn, self.recursive, wrapping=False)
        setattr(self.fn, CACHE_ATTR, real)
        return real(*args, **kwargs)


def _restore() -> None:
    """Remove every stand-in still cached (``torch._dynamo`` is loaded now)."""
    with _lock:
        fns, _deferred[:] = list(_deferred), []
    for fn in fns:
        if isinstance(getattr(fn, CACHE_ATTR, None), _Plain):
            try:
                delattr(fn, CACHE_ATTR)
            except AttributeError:
                pass


class _AfterDynamo(importlib.abc.MetaPathFinder):
    """Runs :func:`_restore` once ``torch._dynamo``'s own import has completed."""

    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: types.ModuleType | None = None) -> Any:
        if name != DYNAMO:
            return None
        sys.meta_path.remove(self)   # once; and find the real spec without this finder
        spec = importlib.util.find_spec(name)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            _restore()
            return spec
        run = loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            try:
                run(module)
            finally:
                _restore()

        loader.exec_module = exec_module  # type: ignore[method-assign]  # this spec's loader
        return spec


def _disable_wrappers() -> list[Callable[..., Any]]:
    """Every function made by ``torch._compile._disable_dynamo`` that exists now."""
    import torch._compile

    code = torch._compile._disable_dynamo(lambda: None).__code__
    return [o for o in gc.get_objects()
            if type(o) is types.FunctionType and o.__code__ is code]


def defer_dynamo() -> int:
    """Let the functions torch disables dynamo for run without importing ``torch._dynamo``
    until something imports it (see the module doc); the number of functions deferred.

    Does nothing (0) when torch is not imported yet, when ``torch._dynamo`` already is, when
    ``MALLETRAIN_DEFER_DYNAMO=0``, or on a torch whose wrapper is not the one this knows."""
    global _installed
    if os.environ.get(ENV_DEFER, "1") == "0" or "torch" not in sys.modules \
            or DYNAMO in sys.modules:
        return 0
    with _lock:
        if _installed:
            return 0
        _installed = True
    wrappers = _disable_wrappers()
    found = []
    for inner in wrappers:
        cells = dict(zip(inner.__code__.co_freevars, inner.__closure__ or ()))
        if set(cells) != {"fn", "recursive"}:
            return 0   # not the wrapper this module was written against: change nothing
        try:
            fn, recursive = cells["fn"].cell_contents, bool(cells["recursive"].cell_contents)
        except ValueError:   # an empty cell
            continue
        if getattr(fn, CACHE_ATTR, None) is None:
            found.append((fn, recursive))
    sys.meta_path.insert(0, _AfterDynamo())
    done = _defer_step_graph_breaks()
    for fn, recursive in found:
        try:
            setattr(fn, CACHE_ATTR, _Plain(fn, recursive))
        except (AttributeError, TypeError):   # a builtin or a slotted callable
            continue
        with _lock:
            _deferred.append(fn)
        done += 1
    return done


def _optimizer_classes() -> list[type]:
    import torch

    seen: list[type] = []
    todo = [torch.optim.Optimizer]
    while todo:
        cls = todo.pop()
        if cls not in seen:
            seen.append(cls)
            todo.extend(cls.__subclasses__())
    return seen


def _eager_step(torch_step: Callable[..., Any], func: Callable[..., Any]) -> Callable[..., Any]:
    """An optimizer's ``step``: torch's wrapper once ``torch._dynamo`` is loaded, before that
    the same less its graph breaks (the grad mode the optimizer asks for, then the caller's)."""
    import torch

    @functools.wraps(torch_step)
    def step(*args: Any, **kwargs: Any) -> Any:
        if DYNAMO in sys.modules:
            return torch_step(*args, **kwargs)
        before = torch.is_grad_enabled()
        try:
            torch.set_grad_enabled(args[0].defaults["differentiable"])
            return func(*args, **kwargs)
        finally:
            torch.set_grad_enabled(before)

    return step


def _defer_step_graph_breaks() -> int:
    """Give each torch optimizer class whose ``step`` is torch's grad-mode wrapper (and not
    yet hooked by a constructed optimizer) :func:`_eager_step`; how many."""
    from torch.optim import optimizer

    code = optimizer._use_grad_for_differentiable(lambda: None).__code__
    done = 0
    for cls in _optimizer_classes():
        torch_step = cls.__dict__.get("step")
        if type(torch_step) is types.FunctionType and torch_step.__code__ is code \
                and hasattr(torch_step, "__wrapped__"):
            cls.step = _eager_step(torch_step, torch_step.__wrapped__)  # type: ignore[attr-defined]
            done += 1
    return done


class _DefaultDdpMode:
    """What DDP's constructor asks of ``torch._dynamo`` (``utils.get_optimize_ddp_mode()``),
    answered with dynamo's default (``optimize_ddp = True``: ``"ddp_optimizer"``), which only a
    compiled DDP uses; anything else imports the real module."""

    class utils:  # noqa: N801 - stands in for the module torch.nn.parallel reads
        @staticmethod
        def get_optimize_ddp_mode() -> str:
            return "ddp_optimizer"

    def __getattr__(self, name: str) -> Any:
        import importlib

        return getattr(importlib.import_module(DYNAMO), name)


@contextlib.contextmanager
def ddp_without_dynamo() -> Iterator[None]:
    """Build a ``DistributedDataParallel`` inside this without importing ``torch._dynamo``
    when it is not loaded (see the module doc); a no-op otherwise."""
    import torch

    if not _installed or DYNAMO in sys.modules or "_dynamo" in vars(torch):
        yield
        return
    stand_in = _DefaultDdpMode()
    vars(torch)["_dynamo"] = stand_in
    try:
        yield
    finally:
        if vars(torch).get("_dynamo") is stand_in:
            del torch._dynamo  # type: ignore[attr-defined]
