"""LAB STAND-IN (tests only) for vllm.logging_utils: vLLM's NewLineFormatter, which upstream's utils/logging_utils.py
uses for its log lines (a multi-line message repeats the record's prefix on each line)."""

import logging
from typing import Any


class NewLineFormatter(logging.Formatter):
    """vLLM's formatter: every line of a multi-line message carries the record's prefix."""

    def __init__(self, fmt: Any = None, datefmt: Any = None, style: Any = "%") -> None:
        logging.Formatter.__init__(self, fmt, datefmt, style)

    def format(self, record: logging.LogRecord) -> str:
        msg = logging.Formatter.format(self, record)
        if record.message != "":
            parts = msg.split(record.message)
            msg = msg.replace("\n", "\r\n" + parts[0])
        return msg
