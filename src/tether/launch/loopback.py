"""Key-value stores that listen only on the address they are reached at.

A ``torch.distributed.TCPStore`` server listens on every interface whatever host it is given: the
host names only where clients connect. A local run's stores (the elastic agent's rendezvous store
and the workers' MASTER_PORT store, which the agent hosts too) would then accept connections from
the whole network, unauthenticated. Handing the store a socket we bound ourselves
(``master_listen_fd``) keeps it on that address: 127.0.0.1 for local runs, the address the user
named otherwise.

:func:`register` adds the rendezvous backend ``tether-loopback`` to torch's elastic registry: the
c10d rendezvous (same protocol, same state machine) with both stores bound this way.
"""

from __future__ import annotations

import contextlib
import datetime
import socket
from collections.abc import Iterator

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousTimeout,
)
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

BACKEND = "tether-loopback"
LISTEN_BACKLOG = 512  # connections waiting to be accepted: every worker connects at once


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket listening on ``host``'s address (not on every interface) at ``port`` (0: any
    free port)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICSERV
    )[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    sock.listen(LISTEN_BACKLOG)
    return sock


def store_server(
    host: str, port: int, timeout: datetime.timedelta, **options: object
) -> dist.TCPStore:
    """A TCPStore server listening on ``host`` only, on a socket of our own (torch's listens on
    every interface). The store owns the socket's descriptor and closes it when it is destroyed;
    this process keeps the store until the launch that made it ends (:func:`stores_of_a_launch`)."""
    sock = listening_socket(host, port)
    store = dist.TCPStore(
        host,
        sock.getsockname()[1],
        is_master=True,
        timeout=timeout,
        wait_for_workers=False,
        master_listen_fd=sock.fileno(),
        **options,  # type: ignore[arg-type]
    )
    sock.detach()  # the store closes the descriptor: a second close could hit a reused number
    _KEEP.append(store)
    return store


_KEEP: list[dist.TCPStore] = []  # the stores this process serves


@contextlib.contextmanager
def stores_of_a_launch() -> Iterator[None]:
    """The stores served for one launch (its rendezvous and its workers' store) are let go when
    it ends, which closes their listening sockets: a process that launches runs one after
    another (a notebook calling ``tether.fit``) keeps nothing listening between them."""
    first = len(_KEEP)
    try:
        yield
    finally:
        del _KEEP[first:]  # the last references: each store closes its socket as it goes


class BoundRendezvousHandler(DynamicRendezvousHandler):
    """torch's dynamic rendezvous handler whose workers' store listens on the node's address."""

    def get_backend(self) -> str:
        return BACKEND

    def _create_tcp_store_server(self, master_addr: str, master_port: int) -> dist.TCPStore:
        return store_server(master_addr, master_port, datetime.timedelta(seconds=300))


def _create_handler(params: RendezvousParameters) -> DynamicRendezvousHandler:
    """The c10d rendezvous, its store served by this process on the endpoint's address."""
    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=29400)
    read_timeout = datetime.timedelta(seconds=int(params.get_as_int("read_timeout", 60) or 60))
    store = store_server(host, port, read_timeout, multi_tenant=True)
    backend = C10dRendezvousBackend(store, params.run_id)
    return BoundRendezvousHandler.from_backend(
        params.run_id,
        store,
        backend,
        params.min_nodes,
        params.max_nodes,
        params.local_addr,
        RendezvousTimeout(),
    )


_REGISTERED: list[str] = []


def register() -> None:
    """Make ``tether-loopback`` a rendezvous backend of this process (idempotent)."""
    if not _REGISTERED:
        rendezvous_handler_registry.register(BACKEND, _create_handler)
        _REGISTERED.append(BACKEND)
