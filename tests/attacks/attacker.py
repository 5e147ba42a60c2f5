"""The hostile local user's side of the attacker suite: run as uid 1000 by conftest.attacker().

It is handed to ``python3 -I -c`` as text (the checkout may sit in a directory uid 1000 cannot read) with a
command and its arguments. Standard library only, Python 3.10+. Loops stop by themselves at their deadline.

  prelink DIR PREFIX SUFFIX TARGET FIRST COUNT  symlink DIR/PREFIX<n>SUFFIX -> TARGET, n = FIRST..FIRST+COUNT-1
  swap DIR NAME KEEP TARGET SECONDS             flip DIR/NAME between a hardlink of DIR/KEEP and a symlink to TARGET
  plant PARENT NAME SECONDS LOG                 keep planting directories (each with a file ``id``) at PARENT/NAME
"""

import contextlib
import os
import sys
import time


def prelink(directory, prefix, suffix, target, first, count):
    for n in range(int(first), int(first) + int(count)):
        with contextlib.suppress(FileExistsError):
            os.symlink(target, os.path.join(directory, f"{prefix}{n}{suffix}"))


def swap(directory, name, keep, target, seconds):
    os.chdir(directory)
    deadline = time.monotonic() + float(seconds)
    flips = 0
    while time.monotonic() < deadline:
        for make in (lambda tmp: os.link(keep, tmp), lambda tmp: os.symlink(target, tmp)):
            tmp = f".swap-{os.getpid()}"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            make(tmp)
            os.rename(tmp, name)
            flips += 1
    # Leave the real file in place.
    tmp = f".swap-{os.getpid()}"
    os.link(keep, tmp)
    os.rename(tmp, name)
    print(flips)


def plant(parent, name, seconds, log):
    """Plant directory after directory at PARENT/NAME: unlink a symlink there, rename a fresh directory in.

    Every planted directory holds ``id`` = ``plant-<n>``; LOG lists every n that was created (renamed in or not).
    """
    os.chdir(parent)
    deadline = time.monotonic() + float(seconds)
    n = 0
    with open(log, "w", encoding="ascii") as out:
        while time.monotonic() < deadline:
            staged = f".plant-{n}"
            os.mkdir(staged)
            with open(os.path.join(staged, "id"), "w", encoding="ascii") as handle:
                handle.write(f"plant-{n}\n")
            out.write(f"{n}\n")
            out.flush()
            n += 1
            try:
                if os.path.islink(name):
                    os.unlink(name)
                os.rename(staged, name)
            except OSError:
                pass  # a directory is already there, or root's link came back: keep the staged one
            time.sleep(0.001)


if __name__ == "__main__":
    {"prelink": prelink, "swap": swap, "plant": plant}[sys.argv[1]](*sys.argv[2:])
