"""LAB STAND-IN (tests only) for vllm.entrypoints."""
