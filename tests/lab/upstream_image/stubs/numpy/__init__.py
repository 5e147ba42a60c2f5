"""LAB STAND-IN (tests only) for numpy: importable, ``random.seed`` only.

Upstream's utils/prompt_generation.py (imported at module level by utils/prompt_client.py up to v0.19.0) imports numpy
and calls ``np.random.seed(42)`` when imported; it uses numpy only for the trace capture's random images. Any other use
raises.
"""

from typing import Any

from numpy import random

__version__ = "0.0.0+ttfleet.lab.standin"
__all__ = ["random"]


def __getattr__(name: str) -> Any:
    raise AttributeError(f"LAB STAND-IN: numpy.{name} is not in the lab image (only random.seed is)")
