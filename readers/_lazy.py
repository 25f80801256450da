"""Classes that subclass a Keras class, built on first use so importing stays Keras-free."""

from __future__ import annotations

from typing import Any, Callable


class LazyClass:
    """Builds a class once, on first `get()`; a module's `__getattr__` can serve it by name.

    Usage in a module::

        _EXPAND = LazyClass(__name__, "ExpandOnDevice", _build_class)
        __getattr__ = _EXPAND.module_getattr()

    The built class is named `module.name`, so pickled instances name it by module and
    qualname, and an unpickling worker process builds it on demand through the
    module's `__getattr__`.
    """

    def __init__(self, module: str, name: str, build: Callable[[], type]) -> None:
        self.module = module
        self.name = name
        self._build = build
        self._cls: type | None = None

    def get(self) -> type:
        if self._cls is None:
            cls = self._build()
            cls.__module__, cls.__qualname__ = self.module, self.name
            self._cls = cls
        return self._cls

    def module_getattr(self) -> Callable[[str], Any]:
        def __getattr__(attr: str) -> Any:
            if attr == self.name:
                return self.get()
            raise AttributeError(f"module {self.module!r} has no attribute {attr!r}")

        return __getattr__
