"""LAB STAND-IN (tests only) for numpy.random: ``seed`` only (see numpy/__init__.py)."""

from typing import Any


def seed(value: Any = None) -> None:
    """Accepted and ignored."""


def __getattr__(name: str) -> Any:
    raise AttributeError(f"LAB STAND-IN: numpy.random.{name} is not in the lab image (only seed is)")
