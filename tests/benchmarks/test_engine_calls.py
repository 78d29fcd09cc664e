"""The engine's per-request and idle ``poll()`` work, counted (not timed): the
counts ``ctlwire bench --only engine_calls`` reports, held to bounds."""

from __future__ import annotations

from ctlwire.benchmarks.engine_calls import count_baseline, count_poll

ROUNDS = 5


def test_a_plain_request_and_an_idle_poll_cost_a_bounded_number_of_python_calls() -> None:
    loop_round, request, burst, idle = count_poll(ROUNDS)
    own = 2  # the counter's own frames (__exit__, stop), once per counted poll()
    # the loop's round, poll(1, timeout): as one poll() below without the second
    # receive_one (its wait is the receive; it asks for no other)
    assert loop_round.py_calls <= ROUNDS * (24 + own), loop_round.by_function
    # one poll(), one request: poll, loop_came_round, receive_one x2 (each through the
    # socket's recv_multipart_within; the second finds nothing), the event's _event,
    # arrive (accept, seen, admit, _check, _begin, go), run_sync (begin, the handler,
    # result, _done, _end, go, end), outbox.send, send_encoded_nowait, the socket's
    # send_multipart_nowait, pyzmq's Socket.send
    assert request.py_calls <= ROUNDS * (26 + own), request.by_function
    # within a burst the poll's own calls are shared: 22 a request
    assert burst.py_calls <= ROUNDS * (16 * 22 + 4 + own), burst.by_function
    # an idle poll(): poll, loop_came_round, receive_one, recv_multipart_within -- and
    # no exception raised (a receive that finds nothing asks EVENTS instead of raising
    # zmq.Again)
    assert idle.py_calls <= ROUNDS * (4 + own), idle.by_function
    assert not any("zmq/error.py" in name or "enum.py" in name
                   for counts in (loop_round, request, burst, idle)
                   for name in counts.by_function), (
        request.by_function, idle.by_function)


def test_the_baseline_engine_loop_is_counted_the_same_way() -> None:
    base = count_baseline(ROUNDS)
    assert 0 < base.py_calls <= ROUNDS * 4, base.by_function  # the method, Socket.send
    # the loop body runs in the counting frame: its bytecodes are counted too
    assert base.bytecodes >= ROUNDS * 20
