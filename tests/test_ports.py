"""Ports the live tools hand to Ray: free now, and outside the kernel's ephemeral range so no
other socket can be given them before Ray binds (CI once lost `ray start` that way)."""

import socket

from faro_serve import ports


def test_free_port_binds_and_lies_between_rays_worker_ports_and_the_ephemeral_range():
    lo, hi = ports.ephemeral_range()
    assert 1024 <= lo < hi <= 65535
    picked = {ports.free_port() for _ in range(20)}
    assert len(picked) > 1  # random, so two tools starting together rarely collide
    for port in picked:
        assert 20000 <= port < lo, port
        assert ports.bindable(port)


def test_a_port_in_use_is_not_handed_out(monkeypatch):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        taken = busy.getsockname()[1]
        busy.listen()
        assert not ports.bindable(taken)

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            free = s.getsockname()[1]

        class Fixed:  # the first draws land on the busy port, then on a free one
            def __init__(self):
                self.n = 0

            def randrange(self, a, b):
                self.n += 1
                return taken if self.n < 5 else free

        monkeypatch.setattr(ports, "ephemeral_range", lambda: (65000, 65535))
        rng = Fixed()
        assert ports.free_port(rng=rng) == free and rng.n == 5


def test_without_room_below_the_ephemeral_range_the_kernel_picks(monkeypatch):
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (20500, 60999))
    port = ports.free_port()
    assert port >= 1024 and ports.bindable(port)


def test_a_port_left_in_time_wait_is_free_to_a_server_that_reuses_addresses():
    """The demo checks its HTTP and dashboard ports as Ray binds them (SO_REUSEADDR): a port
    the last run's connections left in TIME_WAIT is free to it, though not to a plain bind."""
    with socket.socket() as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the last run's server did
        srv.bind(("127.0.0.1", 0))
        port = srv.getsockname()[1]
        srv.listen()
        cli = socket.create_connection(("127.0.0.1", port))
        conn, _ = srv.accept()
        conn.close()  # the server side closes first: its end of the pair waits in TIME_WAIT
        cli.recv(1)
        cli.close()
    assert not ports.bindable(port)
    assert ports.bindable(port, reuse=True)
    with socket.socket() as busy:  # a listener is in use either way
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        assert not ports.bindable(busy.getsockname()[1], reuse=True)
