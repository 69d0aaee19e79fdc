"""What the ``memlab estimate`` process does not import: packages its libraries import at their own import that no
dry run runs (issue 70: the answer's time on a 2-core laptop is mostly imports).

- **bitsandbytes**, which peft imports with itself (``peft.helpers``) and asks for when it makes each adapter (its
  dispatch to bitsandbytes' layers). bitsandbytes wraps its kernels in ``torch.compile`` at its import, which imports
  dynamo and inductor, and prints a line about a CPU kernel it cannot load: 0.5 s of a 5.7 s answer here. No dry run
  runs it: a 4-bit layer and 8-bit AdamW are counted from their layouts, bitsandbytes' version is read from its
  metadata, and a trainer question refuses a 4-bit base.
- **scipy**, which transformers' object-detection losses import with ``modeling_utils`` where it is installed
  (``scipy.optimize``, 0.2 s): no estimate builds such a loss.

Each is hidden (``sys.modules`` maps it to None, so that ``import`` raises ImportError and ``find_spec`` finds nothing)
while the module that would import it runs its import, and that module's own cached checks of it
(``functools.lru_cache``) are asked then, so that they answer "not installed" for the rest of the process. Once
that import ends the package imports as before, for any code that asks for it by name. Only
:func:`memlab.frontends.cli.console_main` installs the finder, for ``estimate`` alone: a notebook's kernel or a test
that imports peft or transformers keeps their support of both.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["UNUSED", "SkipUnusedImports"]

UNUSED: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "peft": ("bitsandbytes", "peft.import_utils", ("is_bnb_available", "is_bnb_4bit_available")),
    "transformers.utils.import_utils": ("scipy", "transformers.utils.import_utils", ("is_scipy_available",)),
}
"""module -> (the package hidden while it imports, the module holding its cached checks of it, their names)."""


class SkipUnusedImports(importlib.abc.MetaPathFinder):
    """A finder, first on ``sys.meta_path``, that imports each module of :data:`UNUSED` with its package hidden; it
    takes itself off once all were imported.

    Example:
        >>> import sys
        >>> finder = SkipUnusedImports(); sys.meta_path.insert(0, finder)
        >>> finder.find_spec("json", None) is None  # any other module: the usual finders
        True
        >>> sys.meta_path.remove(finder)
    """

    def __init__(self) -> None:
        self.waiting = {name for name in UNUSED if name not in sys.modules}

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if fullname not in self.waiting:
            return None
        self.waiting.discard(fullname)
        if not self.waiting and self in sys.meta_path:
            sys.meta_path.remove(self)
        hidden = UNUSED[fullname][0]
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or hidden in sys.modules:  # imported already: nothing to skip
            return spec
        spec.loader = _Hiding(spec.loader, fullname)
        return spec


class _Hiding(importlib.abc.Loader):
    """Runs a module's own loader with its :data:`UNUSED` package hidden, and asks the checks while it is."""

    def __init__(self, loader: Any, name: str) -> None:
        self.loader = loader
        self.name = name

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        hidden, holder, checks = UNUSED[self.name]
        sys.modules[hidden] = None  # type: ignore[assignment]
        try:
            self.loader.exec_module(module)
            for check in (getattr(sys.modules.get(holder), name, None) for name in checks):
                if callable(check):
                    check()  # cached from this first ask
        finally:
            if sys.modules.get(hidden, 0) is None:
                del sys.modules[hidden]

    def __getattr__(self, name: str) -> Any:  # the file loader's other methods (resources, source)
        return getattr(self.loader, name)
