"""The two limits of _net.deadline.Deadline on a real socket: a read that times out because the overall limit
cut its timeout short is reported as that limit, even when the socket gives up a hair before the clock; only a
timeout of the full stall limit is a stall. (A loaded machine once turned a listing's 3 s limit into a message
about a 30 s stall: tests/hostile/test_hub.py, test_endless_pages_stop_at_the_listing_deadline.)"""

import socket

import pytest

from ansible_collections.ttfleet.inference.plugins.module_utils._net.deadline import Deadline
from ansible_collections.ttfleet.inference.plugins.module_utils._net.http import describe


@pytest.fixture
def silent_peer():
    """A listening socket that accepts (in the backlog) and never sends a byte."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    yield server.getsockname()
    server.close()


def timed_out_read(address, deadline):
    with socket.create_connection(address, timeout=5) as sock:
        sock.settimeout(deadline.timeout())
        with pytest.raises(TimeoutError) as exc:
            sock.recv(1)
    return exc.value


def test_a_timeout_cut_short_by_the_overall_limit_is_that_limit(silent_peer):
    deadline = Deadline(total=0.3, stall=30, what="the file list")
    exc = timed_out_read(silent_peer, deadline)
    message = str(describe(exc, deadline, "http://127.0.0.1:1/x"))
    assert message.startswith("the file list from http://127.0.0.1:1: ")
    assert "did not finish within its 0.3 s limit" in message
    assert "stalled" not in message


def test_the_limit_is_named_even_when_the_clock_has_not_quite_reached_it(silent_peer):
    # The socket's own timer and the monotonic clock differ by microseconds: freeze the clock before the limit.
    now = [0.0]
    deadline = Deadline(total=0.3, stall=30, what="the file list", clock=lambda: now[0])
    exc = timed_out_read(silent_peer, deadline)
    now[0] = 0.299
    assert "did not finish within its 0.3 s limit" in str(describe(exc, deadline, "http://127.0.0.1:1/x"))


def test_a_timeout_of_the_whole_stall_limit_is_a_stall(silent_peer):
    deadline = Deadline(total=60, stall=0.3, what="the file list")
    exc = timed_out_read(silent_peer, deadline)
    message = str(describe(exc, deadline, "http://127.0.0.1:1/x"))
    assert message == "the file list from http://127.0.0.1:1 stalled: no data for 0.3 s"
