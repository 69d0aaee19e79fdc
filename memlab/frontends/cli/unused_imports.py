"""What the ``memlab estimate`` process does not import: packages its libraries import at their own import that no
dry run runs (issue 70: the answer's time on a 2-core laptop is mostly imports).

- **bitsandbytes**, which peft imports with itself (``peft.helpers``) and asks for when it makes each adapter (its
  dispatch to bitsandbytes' layers). bitsandbytes wraps its kernels in ``torch.compile`` at its import, which imports
  dynamo and inductor, and prints a line about a CPU kernel it cannot load: 0.5 s of a 5.7 s answer here. No dry run
  needs peft's support of it: a 4-bit layer is counted from its layout, bitsandbytes' version is read from its
  metadata, a trainer question refuses a 4-bit base, and the dry run of 8-bit AdamW imports bitsandbytes by name,
  which works as before.
- **scipy**, which transformers' object-detection losses import at their own import (``transformers.loss.loss_utils``
  imports them all with ``modeling_utils``), where it is installed (``scipy.optimize``, 0.2 s): the command's batches
  are tokens, and no estimate builds such a loss (one that did would raise transformers' own "requires the scipy
  library"). Every other module asks transformers' check afresh and finds scipy (FNet's Fourier transform).

Each is hidden (``sys.modules`` maps it to None, so that ``import`` raises ImportError and ``find_spec`` finds nothing)
while the module that would import it runs its import, with the library's own cached checks of it
(``functools.lru_cache``) cleared first; peft's are asked then and keep that answer, transformers' are cleared again
after. Once that import ends the package imports as before, for any code that asks for it by name. Only
:func:`memlab.frontends.cli.main.console_main` installs the finder, for ``estimate`` alone: a notebook's kernel or a
test that imports peft or transformers keeps their support of both.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["UNUSED", "SkipUnusedImports"]

UNUSED: dict[str, tuple[str, str, tuple[str, ...], bool]] = {
    "peft": ("bitsandbytes", "peft.import_utils", ("is_bnb_available", "is_bnb_4bit_available"), True),
    "transformers.loss.loss_utils": ("scipy", "transformers.utils.import_utils", ("is_scipy_available",), False),
}
"""module -> (the package hidden while it imports, the module holding its cached checks of that package, their
names, whether the checks keep the hidden answer for the rest of the process). peft asks again at each adapter it
makes, so its answer is kept; transformers' answer is cleared before and after its losses' import, so that only they
(the object-detection losses, which import scipy at their own import) take the answer "not installed"."""


class SkipUnusedImports(importlib.abc.MetaPathFinder):
    """A finder, first on ``sys.meta_path``, that imports each module of :data:`UNUSED` with its package hidden, once.

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
        # It stays on sys.meta_path (a set lookup for every other module): taking itself off while the import
        # system loops over that list would skip the next finder.
        if fullname not in self.waiting:
            return None
        self.waiting.discard(fullname)
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
        hidden, holder, names, keep = UNUSED[self.name]
        sys.modules[hidden] = None  # type: ignore[assignment]
        try:
            _clear(holder, names)  # an answer cached before counts no more
            self.loader.exec_module(module)
            if keep:
                for check in (getattr(sys.modules.get(holder), name, None) for name in names):
                    if callable(check):
                        with contextlib.suppress(Exception):  # a check that fails is the library's to say later
                            check()  # cached from this ask
        finally:
            if sys.modules.get(hidden, 0) is None:
                del sys.modules[hidden]
            if not keep:
                _clear(holder, names)

    def __getattr__(self, name: str) -> Any:  # the file loader's other methods (resources, source)
        return getattr(self.loader, name)


def _clear(holder: str, names: tuple[str, ...]) -> None:
    for name in names:
        clear = getattr(getattr(sys.modules.get(holder), name, None), "cache_clear", None)
        if callable(clear):
            clear()
