#!/usr/bin/env python
# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""LAB STAND-IN for an operator at a terminal (tests only): run a command on a pseudo-terminal, type an answer when
a prompt appears, and print everything the command wrote.

    answer_prompt.py --expect 'Type yes to upgrade' --answer yes -- ansible-playbook ...

Exits with the command's exit status; 97 when the prompt never appeared (the answer was not typed).
"""

from __future__ import annotations

import argparse
import os
import pty
import select
import sys
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--expect", required=True)
    parser.add_argument("--answer", required=True)
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("argv", nargs="+")
    args = parser.parse_args()

    pid, fd = pty.fork()
    if pid == 0:
        os.execvp(args.argv[0], args.argv)
    seen = bytearray()
    answered = False
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        ready, _w, _x = select.select([fd], [], [], 1.0)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the command closed the terminal
            break
        if not chunk:
            break
        sys.stdout.buffer.write(chunk)
        sys.stdout.flush()
        seen += chunk
        if not answered and args.expect.encode() in bytes(seen).replace(b"\r\n", b" ").replace(b"\n", b" "):
            time.sleep(0.5)
            os.write(fd, args.answer.encode() + b"\r")
            answered = True
    _pid, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if not answered:
        print(f"\nanswer_prompt: the prompt {args.expect!r} never appeared", flush=True)
        return 97 if code == 0 else code
    return code


if __name__ == "__main__":
    sys.exit(main())
