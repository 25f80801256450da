"""The one enum parser: string enums whose `parse` names the argument, lists the valid
values and says what it received. Standard library only (the readers and the converter
both use it)."""

from __future__ import annotations

import enum
from typing import Any, TypeVar

C = TypeVar("C", bound="Choice")


class Choice(str, enum.Enum):
    """A string enum parsed case-insensitively from its value."""

    @classmethod
    def parse(cls: type[C], value: Any, argument: str | None = None) -> C:
        """`value` as a member; anything else raises ValueError naming `argument`."""
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            raise ValueError(
                f"{argument or cls._argument()} must be one of {cls.values()}. Received: {value!r}"
            ) from None

    @classmethod
    def values(cls) -> list[str]:
        return [m.value for m in cls]

    @classmethod
    def _argument(cls) -> str:
        return cls.__name__


__all__ = ["Choice"]
