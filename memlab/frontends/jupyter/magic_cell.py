"""The cell of a ``%%memfit`` magic: MODEL and BATCH looked up by name, and the cell body compiled into the loss.

Nothing is ``eval``-ed: names are identifiers joined by dots, resolved with dictionary lookups and ``getattr``; the
body is the user's own code, compiled once and run as their loss function. Wrong input raises IPython's
``UsageError`` with one line that says what is wrong and what to write (:func:`usage_error`).
"""

from __future__ import annotations

import ast
import keyword
import re
from collections.abc import Mapping
from typing import Any

from IPython.core.error import UsageError
from torch import nn

from memlab.errors import MemlabError
from memlab.live.batch import Batch, LossFn

__all__ = ["body_loss_fn", "empty_body_transformer", "lookup_name", "usage_error"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_RESULT = "_memfit_loss_"
_CELL_MAGIC_LINE = re.compile(r"^%%memfit(\s|$)")


def usage_error(message: str) -> UsageError:
    """A UsageError whose message is exactly one line.

    Example:
        >>> str(usage_error("two\\nlines"))
        'two lines'
    """
    return UsageError(" ".join(str(message).split()))


# --- names ------------------------------------------------------------------------------------------------------


def lookup_name(namespace: Mapping[str, Any], name: str, what: str) -> Any:
    """The object a name stands for in ``namespace``: ``model``, or an attribute chain such as ``trainer.model``.

    Only identifiers joined by dots are accepted, and they are resolved with dictionary lookups and
    ``getattr``; nothing is ever ``eval``-ed. A bad or unknown name raises a one-line ``UsageError``.

    Example:
        >>> class Trainer:
        ...     model = "the model"
        >>> lookup_name({"trainer": Trainer()}, "trainer.model", "MODEL")
        'the model'
        >>> lookup_name({}, "net", "MODEL")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        IPython.core.error.UsageError: MODEL 'net' is not defined in the notebook; define it in a cell first, ...
    """
    name = name.strip()
    parts = name.split(".")
    if not _NAME.match(name) or any(keyword.iskeyword(part) for part in parts):
        raise usage_error(
            f"{what} {name!r} is not a variable name; write the name of a notebook variable, such as "
            f"{'model' if what == 'MODEL' else 'batch'} or trainer.{'model' if what == 'MODEL' else 'batch'} "
            "(expressions are not evaluated)"
        )
    if parts[0] not in namespace:
        raise usage_error(
            f"{what} {parts[0]!r} is not defined in the notebook; define it in a cell first, or check the spelling"
        )
    value = namespace[parts[0]]
    for depth, part in enumerate(parts[1:], start=1):
        try:
            value = getattr(value, part)
        except AttributeError:
            owner = ".".join(parts[:depth])
            raise usage_error(
                f"{what} {name!r}: {owner} has no attribute {part!r}; write a name that exists, such as {owner}"
            ) from None
    return value


# --- the cell body as the loss ----------------------------------------------------------------------------------


def body_loss_fn(
    body: str | None,
    namespace: Mapping[str, Any],
    model_name: str = "model",
    batch_name: str = "batch",
) -> LossFn | None:
    """The loss function a cell body stands for, compiled once; None for an empty body (``model(**batch).loss``).

    The body runs for every micro-batch in a fresh copy of ``namespace`` in which ``model_name`` and
    ``batch_name`` are bound to the model and the micro-batch (for dotted names such as ``trainer.model``,
    the names ``model`` and ``batch`` are bound instead). The loss is the variable ``loss`` if the body assigns
    it, else the value of the body's last line if that is an expression (``model(**batch).loss``). A syntax
    error, or a body that does neither, raises a one-line ``UsageError``.

    Example:
        >>> import torch
        >>> loss_fn = body_loss_fn("out = model(batch)\\nloss = out.pow(2).mean()", {}, "model", "batch")
        >>> float(loss_fn(lambda x: x, torch.ones(3)))
        1.0
        >>> float(body_loss_fn("net(x).sum()", {}, "net", "x")(lambda x: 2 * x, torch.ones(3)))
        6.0
        >>> body_loss_fn("# nothing here", {}) is None
        True
    """
    source = (body or "").strip("\n")
    try:
        tree = ast.parse(source, filename="<memfit>", mode="exec")
    except SyntaxError as error:
        raise _syntax_error(error) from None
    if not tree.body:
        return None
    try:  # some errors ('return' outside a function, for one) show only when compiling
        compile(tree, "<memfit>", "exec")
    except SyntaxError as error:
        raise _syntax_error(error) from None
    assigns_loss = any(
        isinstance(node, ast.Name) and node.id == "loss" and isinstance(node.ctx, ast.Store) for node in ast.walk(tree)
    )
    if assigns_loss:
        result = "loss"
    elif isinstance(tree.body[-1], ast.Expr):
        last = tree.body[-1]
        assign = ast.Assign(targets=[ast.Name(id=_RESULT, ctx=ast.Store())], value=last.value)
        tree.body[-1] = ast.copy_location(assign, last)
        ast.fix_missing_locations(tree)
        result = _RESULT
    else:
        raise usage_error(
            "the cell body must set loss = ... (or be an expression), for example loss = model(**batch).loss; "
            "leave the body empty for model(**batch).loss"
        )
    try:
        code = compile(tree, "<memfit>", "exec")
    except SyntaxError as error:
        raise _syntax_error(error) from None
    model_key = model_name if "." not in model_name else "model"
    batch_key = batch_name if "." not in batch_name else "batch"

    def loss_fn(model: nn.Module, batch: Batch) -> Any:
        scope = dict(namespace)
        scope.pop("loss", None)
        scope.pop(_RESULT, None)
        scope[model_key] = model
        scope[batch_key] = batch
        exec(code, scope)  # the user's own cell body, run as their loss function
        if result not in scope:
            raise MemlabError("the cell body did not set loss; write loss = ... on every path through it")
        return scope[result]

    loss_fn.__name__ = loss_fn.__qualname__ = "memfit_cell_loss"
    return loss_fn


def _syntax_error(error: SyntaxError) -> UsageError:
    where = f" on line {error.lineno}" if error.lineno else ""
    return usage_error(
        f"the cell body has a syntax error{where}: {error.msg}; "
        "write Python that sets loss = ..., or leave the body empty for model(**batch).loss"
    )



def empty_body_transformer(lines: list[str]) -> list[str]:
    """Let a ``%%memfit`` cell have no body: IPython refuses an empty cell magic body, so give it a blank line.

    An input transformer (IPython's ``input_transformers_cleanup``) that ``%load_ext memlab`` installs; a cell
    that is only ``%%memfit model batch --budget 8GiB`` then means ``model(**batch).loss``, like ``%memfit``.

    Example:
        >>> empty_body_transformer(["%%memfit model batch --budget 8GiB\\n"])
        ['%%memfit model batch --budget 8GiB\\n', '\\n']
        >>> empty_body_transformer(["%%memfit model batch\\n", "loss = model(**batch).loss\\n"])[1]
        'loss = model(**batch).loss\\n'
    """
    if lines and _CELL_MAGIC_LINE.match(lines[0]) and not "".join(lines[1:]).strip():
        first = lines[0] if lines[0].endswith("\n") else lines[0] + "\n"
        return [first, "\n"]
    return lines

