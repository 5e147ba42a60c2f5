"""LAB STAND-IN (tests only) for vLLM (tt-metal build): no engine, no device.

Upstream's run_vllm_api_server.py imports ``ModelRegistry`` (register_model records the TT model classes it names) and
then runs ``vllm.entrypoints.openai.api_server`` with runpy, whose stand-in records what the start received and serves
the lab's HTTP contract (lab_standin.py). utils/logging_utils.py imports ``NewLineFormatter`` from
``vllm.logging_utils`` (or ``vllm.logging`` in older vLLM).
"""

from typing import Any, ClassVar

__version__ = "0.0.0+ttfleet.lab.standin"


class ModelRegistry:
    """Records ``register_model`` calls (GET /lab/config shows them as registered_models)."""

    registered: ClassVar[list[dict[str, Any]]] = []

    @classmethod
    def register_model(cls, model_arch: str, model_cls: Any) -> None:
        target = model_cls if isinstance(model_cls, str) else f"{model_cls.__module__}:{model_cls.__qualname__}"
        cls.registered.append({"architecture": model_arch, "model_cls": target})

    @classmethod
    def get_supported_archs(cls) -> list[str]:
        return [entry["architecture"] for entry in cls.registered]
