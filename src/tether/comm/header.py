"""The fixed message header of Tether's point-to-point protocol.

Every point-to-point message (parameter-server pushes and pulls, EASGD exchanges, handshakes) is a
header followed by a payload of raw tensor bytes. No pickle crosses the wire. The header
is eight int64 words: ``magic, kind, sender, step, length, dtype, loss, loss_steps``. A receiver
checks every field before it receives the payload, so a confused or hostile peer produces a clear error rather than a
receive into a buffer of the wrong size (which aborts a gloo process).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from tether.errors import TetherError

MAGIC = 0x54455448  # "TETH"
HEADER_WORDS = 8

# Wire codes for payload dtypes. The codes are part of the protocol: never renumber.
DTYPE_CODES: dict[torch.dtype, int] = {
    torch.float32: 1,
    torch.float64: 2,
    torch.float16: 3,
    torch.bfloat16: 4,
    torch.int64: 5,
    torch.int32: 6,
    torch.uint8: 7,
}
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}


# The largest step a header may carry: far beyond any run (2^40 steps), small enough that no
# arithmetic on steps overflows and no loop over them can be made to run for ever.
MAX_STEP = 1 << 40
# The most seconds a server's reply may say it has been busy (evaluating, saving): a year
MAX_BUSY_S = 365 * 24 * 3600.0


class MessageKind(enum.IntEnum):
    """What a message means. Methods agree on kinds; receivers say which kinds they accept."""

    HELLO = 1  # handshake: payload describes the sender's model (count, dtype)
    PARAMS = 2  # a flat parameter vector (weights or center variable)
    GRADIENT = 3  # a flat gradient
    PULL = 4  # request for the current weights; empty payload
    STOP = 5  # the sender is done; empty payload
    DELTA = 6  # an elastic difference x_i - c
    BUSY = 7  # the server is evaluating: a worker waiting for its reply waits anew; empty


class ProtocolError(TetherError):
    """A message header failed validation; the message says which field and from whom."""


@dataclass(frozen=True)
class MessageHeader:
    kind: MessageKind
    sender: int
    step: int
    length: int  # number of payload elements
    dtype: torch.dtype
    # A worker's training loss, the mean over its last ``loss_steps`` local steps, riding on
    # the message it sends anyway, so that the server can log every worker's loss. With
    # ``loss_steps`` 0 the word says, in a server's reply, the seconds the server has spent so
    # far on work of its own between replies (evaluating, saving): a worker tells that part of
    # its wait from communication by it (``busy_s``).
    loss: float = 0.0
    loss_steps: int = 0

    @property
    def busy_s(self) -> float:
        return self.loss if self.loss_steps == 0 else 0.0

    def encode(self) -> torch.Tensor:
        loss_bits = int(torch.tensor([self.loss], dtype=torch.float64).view(torch.int64))
        words = [MAGIC, int(self.kind), self.sender, self.step, self.length]
        words += [DTYPE_CODES[self.dtype], loss_bits, self.loss_steps]
        return torch.tensor(words, dtype=torch.int64)

    @staticmethod
    def peek_kind(
        words: torch.Tensor, actual_sender: int, kinds: frozenset[MessageKind]
    ) -> MessageKind:
        """The message kind, checked (with the magic) before a receive buffer is chosen by it."""
        magic, kind = int(words[0]), int(words[1])
        where = f"from rank {actual_sender}"
        if magic != MAGIC:
            raise ProtocolError(f"message {where} has bad magic {magic:#x}: not a Tether peer")
        if kind not in {int(k) for k in kinds}:
            expected = ", ".join(k.name for k in sorted(kinds))
            raise ProtocolError(f"message {where} has kind {kind}, expected {expected}")
        return MessageKind(kind)

    @staticmethod
    def decode(
        words: torch.Tensor,
        actual_sender: int,
        max_length: int,
        dtype: torch.dtype,
        kinds: frozenset[MessageKind] | None = None,
    ) -> MessageHeader:
        """Validate ``words`` as received from ``actual_sender``; raise ProtocolError if off.

        ``max_length`` is the receive buffer's capacity in elements and ``dtype`` its element type:
        a header that announces more, or another type, is refused before any payload is read.
        """
        magic, kind, sender, step, length, code, loss_bits, loss_steps = (
            int(w) for w in words.tolist()
        )
        where = f"from rank {actual_sender}"
        if magic != MAGIC:
            raise ProtocolError(f"message {where} has bad magic {magic:#x}: not a Tether peer")
        if kind not in MessageKind._value2member_map_:
            raise ProtocolError(f"message {where} has unknown kind {kind}")
        parsed = MessageKind(kind)
        if kinds is not None and parsed not in kinds:
            expected = ", ".join(k.name for k in sorted(kinds))
            raise ProtocolError(f"message {where} is {parsed.name}, expected {expected}")
        if sender != actual_sender:
            raise ProtocolError(f"message {where} claims to come from rank {sender}")
        if code not in CODE_DTYPES:
            raise ProtocolError(f"message {where} has unknown dtype code {code}")
        if CODE_DTYPES[code] != dtype:
            raise ProtocolError(
                f"message {where} carries {CODE_DTYPES[code]}, this side expects {dtype}: "
                "the peers were started with different precision settings"
            )
        if not 0 <= step <= MAX_STEP:
            raise ProtocolError(f"message {where} has step {step}, outside 0..{MAX_STEP}")
        if not 0 <= length <= max_length:
            raise ProtocolError(
                f"message {where} announces {length} elements, buffer holds {max_length}: "
                "the peers were started with different models"
            )
        if not 0 <= loss_steps <= MAX_STEP:
            raise ProtocolError(f"message {where} has a loss over {loss_steps} steps")
        # Any float is a loss (a diverging worker's is inf or NaN): it is logged, never used.
        loss = float(torch.tensor([loss_bits], dtype=torch.int64).view(torch.float64))
        if loss_steps == 0 and not 0 <= loss < MAX_BUSY_S:  # busy seconds (NaN fails too)
            raise ProtocolError(f"message {where} says its sender was busy for {loss} s")
        return MessageHeader(parsed, sender, step, length, CODE_DTYPES[code], loss, loss_steps)
