"""What a function *is*, for a derived key: its name, the shape of its code, and what it closes over.

A derived key must name the code and nothing else. Module names do not qualify: a script's function
is ``__main__.fn``, the same function imported is ``pkg.fn``, and Airflow names every DAG file's module
``unusual_prefix_<sha1 of its path>_<file>``, so a moved DAGs folder or a new checkout of a versioned
bundle would change every key. So a function's identity is:

* its **qualified name** without the module (``Features.build``, ``make.add`` for a closure), which is
  what people read in keys;
* the **shape of its source**: the function's syntax tree, printed back without decorators, docstring,
  comments or formatting (so a commit that only changes a comment, a docstring, the indentation or a
  decorator's arguments keeps the key, and any change of the code changes it). As in Prefect's
  ``TASK_SOURCE`` policy, but robust to the cosmetic changes that must not cost a recomputation. A
  lambda is told apart from another on the same line by the columns its code occupies;
* the **values it closes over** (two closures of one factory, ``make(1)`` and ``make(2)``, differ),
  digested like arguments; a function it closes over contributes its own identity. They are taken
  once per function object, at its first derived key: a function that appends to a list it closes
  over (a log of calls, say) keeps its key.

Defaults are part of the arguments (a call is bound to the signature with defaults applied), so they
count too. What the function reads from module globals, and the code of the functions it calls, do
not: pass such values as arguments, or bump ``version=`` when they change.

Where something cannot be digested (no source and no code object, a closure holding a client), the
error says so and suggests ``key=`` or ``version=``. With ``version=`` the caller names the code, and
what it closes over, itself: neither is digested, only the arguments (and ``functools.partial``'s).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import inspect
import textwrap
import threading
import types
import weakref
from collections.abc import Callable
from typing import Any

from dibs.canonical import canonical_json
from dibs.errors import InvalidKey

__all__ = ["code_identity", "qualified_name"]


def qualified_name(fn: Callable[..., Any]) -> str:
    """The readable name of a callable in keys: its qualified name, without module or ``<locals>``."""
    target = _unwrap(fn)
    while isinstance(target, functools.partial):
        target = _unwrap(target.func)
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or type(target).__name__
    return str(name).replace("<locals>.", "")


def code_identity(fn: Callable[..., Any], *, version: str | None = None) -> dict[str, Any]:
    """The digestible identity of ``fn``'s code (see the module docstring), as canonical data.

    :raises InvalidKey: when part of it cannot be digested and no ``version`` names the code instead.
    """
    target = _unwrap(fn)
    identity: dict[str, Any] = {}
    while isinstance(target, functools.partial):
        identity.setdefault("partial", []).append(_partial_arguments(target, fn, version))
        target = _unwrap(target.func)
    if version is None:
        identity["code"] = _shape_of(target, fn)
        closure = _closure_of(target, fn)
        if closure:
            identity["closure"] = closure
    return identity


_CLOSURES: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


class _InProgress(threading.local):
    def __init__(self) -> None:
        self.names: list[Any] = []


#: The functions whose closures this thread is digesting, against recursion (``def f(): ... f()``).
_IN_PROGRESS = _InProgress()
_CLOSURES_LOCK = threading.Lock()


def _closure_of(target: Any, fn: Callable[..., Any]) -> dict[str, Any]:
    """The closure values of ``target``, digested once per function object (see the module docstring)."""
    with _CLOSURES_LOCK:
        known = _CLOSURES.get(target)
    if known is None:
        known = _closure_values(target, fn)
        with contextlib.suppress(TypeError), _CLOSURES_LOCK:  # a target without weak references: not cached
            known = _CLOSURES.setdefault(target, known)
    return known


def _unwrap(fn: Callable[..., Any]) -> Any:
    target: Any = inspect.unwrap(fn)
    if isinstance(target, types.MethodType):
        target = target.__func__
    return target


def _cannot(fn: Callable[..., Any], why: str) -> InvalidKey:
    name = qualified_name(fn)
    return InvalidKey(
        f"cannot derive a key for {name}: {why}. Give the key yourself (key='...'), or name the code "
        "with version='...' (then only the arguments and what can be digested are part of the key)",
        name=name,
    )


def _shape_of(target: Any, fn: Callable[..., Any]) -> str:
    code = getattr(target, "__code__", None)
    if not isinstance(code, types.CodeType):
        raise _cannot(fn, f"a {type(target).__name__} has no Python source or code to digest")
    shape = _source_shape(code, getattr(target, "__name__", ""))
    return shape if shape is not None else _bytecode_shape(code)


@functools.lru_cache(maxsize=4096)
def _source_shape(code: types.CodeType, name: str) -> str | None:
    """The digest of the function's syntax tree, printed back without what does not change behaviour;
    ``None`` when its source cannot be read or parsed (then the bytecode stands in)."""
    try:
        lines, first = inspect.findsource(code)
        source = "".join(inspect.getblock(lines[first:]))
    except (OSError, TypeError, IndexError):
        return None
    indent = len(source) - len(source.lstrip(" \t"))
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:  # a lambda inside a larger expression spanning several lines, say
        return None
    node = _lambda_node(tree, code, first, indent) if name == "<lambda>" else _def_node(tree, name)
    if node is None:
        return None
    return hashlib.sha256(ast.unparse(node).encode()).hexdigest()


def _def_node(tree: ast.Module, name: str) -> ast.AST | None:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            node.decorator_list = []
            body = node.body
            first = body[0] if body else None
            docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            if docstring and isinstance(first.value.value, str):  # type: ignore[union-attr]
                node.body = body[1:] or [ast.Pass()]
            return node
    return None


def _lambda_node(tree: ast.Module, code: types.CodeType, first: int, indent: int) -> ast.AST | None:
    """The lambda of ``code`` among the lambdas of its line(s): the one whose columns hold its body."""
    lambdas = [node for node in ast.walk(tree) if isinstance(node, ast.Lambda)]
    if len(lambdas) == 1:
        return lambdas[0]
    for line, _, column, _ in code.co_positions():
        if line is None or column is None or line < code.co_firstlineno or column == 0:
            continue
        row, col = line - first, column - indent  # relative to the parsed, dedented block
        for node in lambdas:
            start = (node.body.lineno, node.body.col_offset)
            end = (node.body.end_lineno or node.body.lineno, node.body.end_col_offset or 0)
            if start <= (row, col) < end:
                return node
        break
    return None


def _bytecode_shape(code: types.CodeType) -> str:
    """Without source (a function built by ``exec``, an interactive session): the code object itself,
    without its file name or line numbers. Python-version specific, so it shares less, never wrongly."""
    parts: list[Any] = [code.co_code, code.co_names, code.co_varnames, code.co_argcount]
    for const in code.co_consts:
        parts.append(_bytecode_shape(const) if isinstance(const, types.CodeType) else repr(const))
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _closure_values(target: Any, fn: Callable[..., Any]) -> dict[str, Any]:
    code = getattr(target, "__code__", None)
    cells = getattr(target, "__closure__", None)
    if not isinstance(code, types.CodeType) or not cells:
        return {}
    values: dict[str, Any] = {}
    for name, cell in zip(code.co_freevars, cells, strict=True):
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell: a name assigned only after this function was made
            values[name] = {"__empty__": True}
            continue
        if isinstance(value, type):  # a class (also ``__class__`` of a method using super())
            values[name] = {"__class__": value.__qualname__}
            continue
        if isinstance(value, types.ModuleType):
            values[name] = {"__module__": value.__name__}
            continue
        if inspect.isfunction(value) or isinstance(value, functools.partial | types.MethodType):
            if _unwrap(value) in _IN_PROGRESS.names:  # a recursive inner function: its name is enough
                values[name] = {"__function__": qualified_name(value)}
                continue
            _IN_PROGRESS.names.append(target)
            try:
                values[name] = {"__function__": qualified_name(value), **code_identity(value)}
            finally:
                _IN_PROGRESS.names.pop()
            continue
        try:
            values[name] = {"__value__": canonical_json(value)}  # a copy: the value may change later
        except TypeError:
            kind = f"{type(value).__module__}.{type(value).__qualname__}"
            raise _cannot(
                fn,
                f"it closes over {name!r}, a {kind}, which has no stable digest (a value that does not "
                "change the result can be passed as an argument listed in exclude= instead)",
            ) from None
    return values


def _partial_arguments(partial: functools.partial[Any], fn: Callable[..., Any], version: str | None) -> Any:
    arguments = {"args": list(partial.args), "kwargs": dict(partial.keywords)}
    try:
        canonical_json(arguments)
    except TypeError:
        if version is not None:
            return None
        raise _cannot(fn, "the arguments bound by functools.partial have no stable digest") from None
    return arguments
