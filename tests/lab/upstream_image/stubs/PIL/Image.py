"""LAB STAND-IN (tests only) for PIL.Image: importable, every use raises (see PIL/__init__.py)."""

from typing import Any


def __getattr__(name: str) -> Any:
    raise AttributeError(f"LAB STAND-IN: PIL.Image.{name} is not in the lab image")
