"""LAB STAND-IN (tests only) for torch: importable, ``manual_seed`` only.

Upstream's utils/prompt_generation.py (imported at module level by utils/prompt_client.py up to v0.19.0) imports torch
and calls ``torch.manual_seed(42)`` when imported; it uses torch only to draw random prompts for the trace capture,
which needs a tokenizer the lab does not have. Any other use raises. Real torch would add about 700 MB to an image that
every scenario saves and loads.
"""

from typing import Any

__version__ = "0.0.0+ttfleet.lab.standin"


def manual_seed(seed: int) -> None:
    """Accepted and ignored (nothing in the lab draws random numbers from torch)."""


def __getattr__(name: str) -> Any:
    raise AttributeError(f"LAB STAND-IN: torch.{name} is not in the lab image (only manual_seed is)")
