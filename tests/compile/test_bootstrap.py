"""NCCL's unique id crosses processes as raw bytes, checked, never pickled (CPU, no GPU needed).

Under torchrun, ``flowdsl.init()`` shares the id through the job's TCP store, which anyone
who reaches its port can write. The stored value is the id's 128 bytes; anything else is
refused with a clear error and never unpickled. The torchrun path is driven here through
a stand-in for ``torch.distributed`` (its ``TCPStore``) and for the GPU communicator.
"""

from __future__ import annotations

import os
import pickle
import sys
import types

import numpy as np
import pytest
from nccl.core import get_unique_id

from flowdsl import UsageError
from flowdsl.runtime import communicator

pytestmark = pytest.mark.compile

KEY = "flowdsl_nccl_unique_id"


class DictStore:
    """The part of ``torch.distributed.TCPStore`` the exchange uses, over one dict shared by every rank."""

    shared: dict = {}

    def __init__(self, *args, **kwargs):
        self.data = DictStore.shared

    def set(self, key, value):
        self.data[key] = value if isinstance(value, bytes) else str(value).encode()

    def get(self, key):
        return self.data[key]


class Unpickled(Exception):
    """Raised if a pickle from the store is ever loaded."""


class Payload:
    def __reduce__(self):
        return (_unpickled, ())


def _unpickled():
    raise Unpickled("a value from the store was unpickled")


def test_the_store_holds_the_raw_bytes_and_every_rank_reads_them():
    uid = get_unique_id().as_bytes
    store = DictStore()
    store.data.clear()
    assert communicator.exchange_through_store(store, 0, uid) == uid
    assert store.data[KEY] == uid and len(uid) == communicator.UNIQUE_ID_BYTES  # no pickle framing
    assert communicator.exchange_through_store(DictStore(), 1, None) == uid


@pytest.mark.parametrize("value,message", [
    (pickle.dumps(bytes(range(128))), r"holds 14\d bytes, but NCCL's unique id has 128"),  # an older flowdsl's
    (pickle.dumps(Payload()), r"holds \d+ bytes, but NCCL's unique id has 128"),  # never loaded
    (b"", r"holds 0 bytes"),
    (bytes(127), r"holds 127 bytes"),
    (bytes(129), r"holds 129 bytes"),
    ("x" * 128, r"holds a str, not NCCL's unique id \(128 raw bytes\)"),
    (None, r"holds a NoneType"),
    (12, r"holds a int"),
], ids=["pickled-id", "pickled-payload", "empty", "short", "long", "str", "none", "int"])
def test_a_malformed_store_value_is_a_clear_error(value, message):
    store = DictStore()
    store.data.clear()
    store.data[KEY] = value
    with pytest.raises(UsageError, match=r"Cannot initialise a multi-rank communicator: the TCP store's key "
                                         rf"'{KEY}' {message}.*MASTER_ADDR:MASTER_PORT"):
        communicator.exchange_through_store(store, 1, None)


class BufferComm:
    """An mpi4py communicator with ``Bcast`` only (the buffer broadcast; ``bcast`` would pickle)."""

    def __init__(self, root_buffer: bytes):
        self.root_buffer = root_buffer

    def Bcast(self, buf, root=0):  # noqa: N802 - mpi4py's name
        assert root == 0 and isinstance(buf, np.ndarray) and buf.dtype == np.uint8
        buf[:] = np.frombuffer(self.root_buffer, np.uint8)


def test_mpi_broadcasts_a_buffer_of_bytes():
    uid = get_unique_id().as_bytes
    assert communicator.broadcast_through_mpi(BufferComm(uid), uid) == uid
    assert communicator.broadcast_through_mpi(BufferComm(uid), None) == uid


@pytest.fixture
def torchrun(monkeypatch):
    """Rank 1 of 2 under torchrun, with a stand-in TCPStore and no GPU communicator."""
    dist = types.ModuleType("torch.distributed")
    dist.is_initialized = lambda: False
    dist.TCPStore = DictStore
    torch = types.ModuleType("torch")
    torch.distributed = dist
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "2", "RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(communicator, "require_gpu", lambda operation: None)
    made = []

    def communicator_of(*args):  # records what the GPU communicator would be made from
        made.append(args)
        return types.SimpleNamespace(args=args)
    monkeypatch.setattr(communicator, "Communicator", communicator_of)
    DictStore.shared.clear()
    return made


def test_init_under_torchrun_reads_the_id_from_the_store(torchrun):
    uid = get_unique_id().as_bytes
    DictStore.shared[KEY] = uid  # what rank 0 put there
    communicator.init()
    assert torchrun == [(2, 1, uid, int(os.environ.get("LOCAL_RANK", "0")))]


def test_init_under_torchrun_refuses_a_pickle_in_the_store(torchrun):
    DictStore.shared[KEY] = pickle.dumps(Payload())  # written by someone who reached the store's port
    with pytest.raises(UsageError, match=r"the TCP store's key 'flowdsl_nccl_unique_id' holds \d+ bytes"):
        communicator.init()
    assert torchrun == []


def test_init_refuses_an_explicit_unique_id_of_the_wrong_length(monkeypatch):
    monkeypatch.setattr(communicator, "require_gpu", lambda operation: None)
    with pytest.raises(UsageError, match=r"unique_id= holds 16 bytes, but NCCL's unique id has 128\. Pass rank "
                                         r"0's nccl.core.get_unique_id\(\).as_bytes"):
        communicator.init(2, 0, bytes(16))
