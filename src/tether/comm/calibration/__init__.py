"""The calibration of the collectives on the running transport: what ``auto`` chooses by and
what ``tether bench comm`` predicts with.

docs/communication.md: a message of n bytes costs ``a + n*b`` and reducing n bytes ``n*g``.
The calibration measures these where our algorithms will run, through the same point-to-point
``exchange`` the schedule runner uses (so ``a`` includes the per-message software overhead our
runner pays, as Hockney's model intends): ``a`` is the one-way time of a 4-byte ping-pong,
``b`` the slope between two large ping-pongs, ``g`` the time per byte of an in-place add. When
the ranks span several nodes (as many ranks per node as the caller says), the ping-pong is also
run between two nodes and the schedule's inter-node steps are priced with those values.

The formula predicts from these three numbers (``tether bench comm`` prints it beside every
measurement), but it cannot know what a machine does to a chain of dependent rounds: with more
ranks than cores, every round waits for the next rank to be scheduled, so a 6-round ring costs far
more than 6 ping-pongs. And the backend's own collectives are opaque (gloo and NCCL switch
algorithms by size). So the calibration also TIMES every candidate algorithm, native included,
at a few sizes on the running group (interpolated log-log between them), and ``auto`` chooses by
those times: by the model where they are missing, and ``native`` unless another algorithm beat
it clearly (by a margin in the median and in nearly every round, each round timing every
algorithm under the same conditions) at the timed sizes on both sides of the message, so noise
and interpolation do not make ``auto`` slower than the backend.

It measures, so it runs collectives: it lives with them, below everything that chooses where a
cache lives or how ranks are placed (those are its callers' arguments). The modules:

* :mod:`~tether.comm.calibration.model`: the numbers, the predictions and ``auto``'s choice,
  and their JSON form;
* :mod:`~tether.comm.calibration.measure`: the measurement itself;
* :mod:`~tether.comm.calibration.cache`: a calibration measured once per host and group shape,
  cached, and shared by every rank;
* :mod:`~tether.comm.calibration.timed_algorithms`: the algorithms timed side by side, and what
  counts as a clear win over native;
* :mod:`~tether.comm.calibration.rounds`: how those timing rounds are formed (shared with
  ``tether bench comm``).
"""
