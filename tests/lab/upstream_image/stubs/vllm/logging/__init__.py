"""LAB STAND-IN (tests only) for vllm.logging (older vLLM's home of NewLineFormatter, upstream's fallback import)."""

from vllm.logging_utils import NewLineFormatter

__all__ = ["NewLineFormatter"]
