"""LAB STAND-IN (tests only) for transformers: ``AutoTokenizer`` only.

Upstream's utils/prompt_client.py (and utils/prompt_generation.py, which it imports) import AutoTokenizer at module
level, so run_vllm_api_server.py cannot start without it; the lab has no tokenizer files. Loading one raises, which
stops upstream's background trace capture (a separate process) the way a missing tokenizer would, and nothing else.
"""

from typing import Any


class AutoTokenizer:
    """Importable; loading a tokenizer raises (the lab image has none)."""

    @classmethod
    def from_pretrained(cls, name: Any, *args: Any, **kwargs: Any) -> Any:
        raise OSError(f"LAB STAND-IN: the lab image has no tokenizer files (asked for {name!r})")
