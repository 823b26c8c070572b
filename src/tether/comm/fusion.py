"""Tensor fusion: gradients packed into one flat buffer, reduced bucket by bucket during backward.

The paper's "single-layer communication" (You, Buluc, Demmel, SC17, section 5.1) puts all layers in
one contiguous buffer so an exchange is one message instead of one per layer: under the alpha-beta
model a message of n words costs ``a + b*n``, so L small messages pay ``a`` L times. Wait-free
backprop (Shi and Chu's DAG model; PyTorch DDP's buckets) adds the overlap: the buffer is cut into
buckets of a size threshold, and each bucket's all-reduce is launched as soon as every gradient it
covers has been produced by backward, while backward continues on earlier layers.

Layout: parameters are laid out in REVERSE registration order, because backward produces the last
layer's gradient first; bucket 0 then fills first. Buckets are fixed-size slices of the flat buffer,
so a parameter may straddle two buckets; a bucket is ready when all parameters overlapping it are.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.autograd import Variable

from tether.comm.reducer import AllReducer, PendingReduce


@dataclass(frozen=True)
class Bucket:
    start: int  # flat offset, inclusive
    end: int  # flat offset, exclusive
    params: tuple[int, ...]  # indices (in layout order) of parameters overlapping [start, end)


@dataclass(frozen=True)
class BucketLayout:
    """Where each parameter lives in the flat buffer and how the buffer is cut into buckets."""

    sizes: tuple[int, ...]  # element counts, in layout order
    offsets: tuple[int, ...]
    buckets: tuple[Bucket, ...]

    @property
    def numel(self) -> int:
        return self.offsets[-1] + self.sizes[-1] if self.sizes else 0

    @staticmethod
    def build(sizes: Sequence[int], bucket_elems: int | None) -> BucketLayout:
        """Cut ``sizes`` into buckets of ``bucket_elems`` elements (the last may be shorter).

        ``bucket_elems=None`` gives one bucket per parameter: the unfused baseline.
        """
        offsets, total = [], 0
        for size in sizes:
            offsets.append(total)
            total += size
        if bucket_elems is None:
            ranges = [(o, o + s) for o, s in zip(offsets, sizes, strict=True) if s]
        else:
            assert bucket_elems >= 1
            ranges = [(a, min(a + bucket_elems, total)) for a in range(0, total, bucket_elems)]
        buckets = []
        for start, end in ranges:
            overlapping = tuple(
                i
                for i, (o, s) in enumerate(zip(offsets, sizes, strict=True))
                if s and o < end and o + s > start
            )
            buckets.append(Bucket(start, end, overlapping))
        return BucketLayout(tuple(sizes), tuple(offsets), tuple(buckets))


def bucket_elements(bucket_mb: float | None, element_size: int) -> int | None:
    """Bucket capacity in elements for a threshold in MiB (None: one bucket per parameter)."""
    if bucket_mb is None:
        return None
    return max(1, int(bucket_mb * 2**20) // element_size)


class GradientBucketer:
    """Averages gradients over the group with bucketed all-reduces overlapped with backward.

    Each parameter's ``.grad`` is made a view into one flat buffer, so autograd accumulates straight
    into it (no copy). A post-accumulate-grad hook counts down each bucket; when a bucket is full it
    is launched asynchronously; :meth:`finish` waits for them all and re-arms the countdowns for
    the next backward pass. Buckets are launched strictly in index order on every rank, because
    collectives must be issued in the same order everywhere (the gloo/NCCL contract).

    The first hook of a backward pass queues :meth:`finish` on autograd's engine, which runs it
    as the pass ends (DDP does the same): the gradients are the group's mean when ``backward()``
    returns, so code between backward and the optimizer's step (a user's clipping, a second
    backward that accumulates) sees final gradients, not buffers that all-reduces still write.

    A parameter that no rank's backward reached (a branch the model did not take) is left with
    no gradient (``.grad`` None), as in one process and under DDP: an optimizer then skips it,
    where a zero gradient would still move it (weight decay, momentum, LAMB's step). Which
    parameters each rank used rides in the last bucket's all-reduce, one flag per parameter
    after the gradients (no collective of its own); only a rank that did not use some parameter
    reads the flags back.
    """

    def __init__(
        self,
        params: Sequence[nn.Parameter],
        reducer: AllReducer,
        bucket_mb: float | None,
        overlap: bool = True,
    ) -> None:
        self.params = list(reversed([p for p in params if p.requires_grad]))
        self.reducer = reducer
        dtype = self.params[0].dtype
        elems = bucket_elements(bucket_mb, self.params[0].element_size())
        self.layout = BucketLayout.build([p.numel() for p in self.params], elems)
        # The gradients, then one "used" flag per parameter (reduced with the last bucket).
        numel = self.layout.numel
        self.buffer = torch.zeros(
            numel + len(self.params), dtype=dtype, device=self.params[0].device
        )
        self.flat = self.buffer[:numel]  # every gradient, the parameters' .grad views into it
        self._used = self.buffer[numel:]  # after the reduction: the mean of the ranks' flags
        self._fired = [False] * len(self.params)  # this rank's backward reached the parameter
        self._views = [
            self.flat[o : o + p.numel()].view_as(p)
            for o, p in zip(self.layout.offsets, self.params, strict=True)
        ]
        self._buckets_of_param: list[list[int]] = [[] for _ in self.params]
        for b, bucket in enumerate(self.layout.buckets):
            for i in bucket.params:
                self._buckets_of_param[i].append(b)
        self._hooks = [
            p.register_post_accumulate_grad_hook(self._make_hook(i))
            for i, p in enumerate(self.params)
        ]
        self.comm_wait_s = 0.0
        # False while gradients accumulate over several backward passes before one update:
        # nothing is launched until the pass that ends the accumulation.
        self.enabled = True
        # False: nothing is launched during backward; finish() sends every bucket after it
        # (the no-overlap baseline of Shi and Chu's DAG model, T_naive)
        self.overlap = overlap
        # finish() queued for the end of the current backward pass, and the wait interval of
        # the last pass it ended (handed to the next finish() call: the step's exposed wait).
        self._finish_queued = False
        self._finished: tuple[float, float] | None = None
        self._arm()
        self.zero_grad()

    def _make_hook(self, index: int):
        def hook(param: torch.Tensor) -> None:
            self._on_grad_ready(index, param)

        return hook

    def zero_grad(self) -> None:
        """Zero the flat gradient, every parameter's ``.grad`` a view into it (the optimizer's
        ``zero_grad`` for these parameters: one memset, nothing reallocated).

        A backward that raised left its pass half done (buckets counted down or launched, the
        finish it queued never run): what it launched lands first (an all-reduce in flight
        writes into the buffer), and the next pass starts afresh."""
        for handle in self._handles:
            handle.wait()
        self._arm()
        self._finish_queued = False
        self._fired = [False] * len(self.params)
        self.buffer.zero_()
        for p, view in zip(self.params, self._views, strict=True):
            p.grad = view

    def _arm(self) -> None:
        """Reset the per-bucket countdowns for the next backward pass."""
        self._remaining = [len(b.params) for b in self.layout.buckets]
        self._next_to_launch = 0
        self._handles: list[PendingReduce] = []

    def _on_grad_ready(self, index: int, param: torch.Tensor) -> None:
        self._fired[index] = True  # in any pass of an accumulation
        view = self._views[index]
        if param.grad is not view:
            # Someone replaced .grad (e.g. zero_grad(set_to_none=True)); keep the flat buffer
            # authoritative.
            assert param.grad is not None
            view.copy_(param.grad)
            param.grad = view
        if not self.enabled:
            return
        if not self._finish_queued:
            self._finish_queued = True
            Variable._execution_engine.queue_callback(self._finish_backward)
        if not self.overlap:
            return
        for b in self._buckets_of_param[index]:
            self._remaining[b] -= 1
        self._launch_ready()

    def _launch_ready(self, force: bool = False) -> None:
        buckets = self.layout.buckets
        while self._next_to_launch < len(buckets) and (
            force or self._remaining[self._next_to_launch] == 0
        ):
            bucket = buckets[self._next_to_launch]
            end = bucket.end
            if self._next_to_launch == len(buckets) - 1:  # the last also carries the flags
                self._used.copy_(torch.tensor(self._fired, dtype=self.buffer.dtype))
                end = self.buffer.numel()
            chunk = self.buffer[bucket.start : end]
            self._handles.append(self.reducer.start(chunk, average=True))
            self._next_to_launch += 1

    def _adopt_replaced_gradients(self) -> None:
        """A parameter that backward did not reach (unused this step) after someone set its
        ``.grad`` to None or replaced it (``model.zero_grad()``) contributes that gradient, or
        zeros, not what its view held before."""
        for i, (p, view) in enumerate(zip(self.params, self._views, strict=True)):
            if p.grad is not view:
                if p.grad is None:
                    view.zero_()
                else:
                    view.copy_(p.grad)
                    self._fired[i] = True  # a gradient of the user's: it counts as used
                p.grad = view

    def _finish_backward(self) -> None:
        self._finish_queued = False
        self._finished = self._wait_all()

    def finish(self) -> tuple[float, float]:
        """Launch what is left (parameters unused this step), wait for every bucket's mean; a
        backward pass that reached the hooks has done so as it ended, and this returns its wait.

        Returns when the wait began and ended (``time.perf_counter``): the communication that
        backward did not hide.
        """
        if self._finished is not None:
            finished, self._finished = self._finished, None
            return finished
        return self._wait_all()

    def _wait_all(self) -> tuple[float, float]:
        if self.flat.is_cuda:  # backward's kernels are the computation, not the wait
            torch.cuda.synchronize(self.flat.device)
        start = time.perf_counter()
        self._adopt_replaced_gradients()
        self._launch_ready(force=True)
        for handle in self._handles:
            handle.wait()
        self._arm()
        self._drop_unused()
        end = time.perf_counter()
        self.comm_wait_s += end - start
        return start, end

    def _drop_unused(self) -> None:
        """No gradient for a parameter that no rank used since the gradients were last zeroed
        (the flags' mean is 0). The flags are kept until ``zero_grad``: a second backward before
        the step adds to the gradients, and a parameter only the first reached keeps its own."""
        unused = [i for i, fired in enumerate(self._fired) if not fired]
        if not unused:
            return  # used here, so used somewhere: no flag to read (no device sync on a GPU)
        used = self._used.tolist()
        for i in unused:
            if used[i] == 0.0:
                self.params[i].grad = None

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
