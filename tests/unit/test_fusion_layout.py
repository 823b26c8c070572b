"""Bucket layouts: every element in exactly one bucket, parameters straddling boundaries."""

from __future__ import annotations

from tether.comm.fusion import BucketLayout, bucket_elements


def test_fixed_size_buckets_cover_the_buffer_and_split_parameters() -> None:
    layout = BucketLayout.build([5, 3, 8], bucket_elems=4)
    assert layout.numel == 16 and layout.offsets == (0, 5, 8)
    assert [(b.start, b.end) for b in layout.buckets] == [(0, 4), (4, 8), (8, 12), (12, 16)]
    # Parameter 0 (elements 0-4) straddles buckets 0 and 1; bucket 1 also holds parameter 1.
    assert [b.params for b in layout.buckets] == [(0,), (0, 1), (2,), (2,)]


def test_per_parameter_layout_is_the_unfused_baseline() -> None:
    layout = BucketLayout.build([5, 0, 3], bucket_elems=None)
    assert [(b.start, b.end, b.params) for b in layout.buckets] == [(0, 5, (0,)), (5, 8, (2,))]


def test_one_bucket_when_threshold_exceeds_model() -> None:
    layout = BucketLayout.build([5, 3], bucket_elems=1000)
    assert [(b.start, b.end, b.params) for b in layout.buckets] == [(0, 8, (0, 1))]


def test_bucket_elements_from_megabytes() -> None:
    assert bucket_elements(1.0, 4) == 262144
    assert bucket_elements(None, 4) is None
    assert bucket_elements(1e-9, 4) == 1


class _RecordingReducer:
    """Records each bucket launched, and whether backward had computed every gradient by then
    (a parameter's gradient view stays zero until autograd accumulates into it)."""

    def __init__(self, params) -> None:
        self.params = list(params)
        self.launched: list[tuple[int, bool]] = []

    def start(self, chunk, average: bool):
        from tether.comm.reducer import PendingReduce

        computed = all(bool(p.grad.abs().sum() > 0) for p in self.params)
        self.launched.append((chunk.numel(), computed))
        return PendingReduce(tensor=chunk, wire=chunk, done=True)


def test_buckets_launch_during_backward_only_when_overlapping() -> None:
    import torch
    from torch import nn

    from tether.comm.fusion import GradientBucketer

    for overlap in (True, False):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        reducer = _RecordingReducer(net.parameters())
        bucketer = GradientBucketer(list(net.parameters()), reducer, 1e-4, overlap=overlap)
        net(torch.randn(3, 8)).sum().backward()
        # Every bucket was sent, once, and waited for, by the time backward() returned (as
        # DDP: code between backward and the step sees the mean); finish() adds nothing.
        sizes = [size for size, _ in reducer.launched]
        params = list(net.parameters())  # and the last bucket carries a used-flag per parameter
        assert sum(sizes) == sum(p.numel() for p in params) + len(params)
        assert len(sizes) > 2
        start, end = bucketer.finish()
        assert start <= end and len(reducer.launched) == len(sizes)
        # overlapping: the first buckets went while the first layer's gradients were still
        # being computed; without overlap, only after backward had computed every gradient
        computed = [when for _, when in reducer.launched]
        assert all(computed) is not overlap and computed[-1]


def test_a_pass_after_a_backward_that_raised_sends_every_bucket_once() -> None:
    """The failed pass's countdowns and launches stayed: the next pass skipped the buckets
    already sent and launched others before their gradients were computed, so the replicas
    stepped on partly local gradients."""
    import pytest
    import torch
    from torch import nn

    from tether.comm.fusion import GradientBucketer

    class RaiseOnce(torch.autograd.Function):
        armed = True

        @staticmethod
        def forward(ctx, x):  # type: ignore[override]
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):  # type: ignore[override]
            if RaiseOnce.armed:
                RaiseOnce.armed = False
                raise RuntimeError("a user's backward failed")
            return grad

    torch.manual_seed(0)
    first, second = nn.Linear(8, 16), nn.Linear(16, 4)
    params = [*first.parameters(), *second.parameters()]
    reducer = _RecordingReducer(params)
    bucketer = GradientBucketer(params, reducer, 1e-4)
    x = torch.randn(3, 8)
    with pytest.raises(RuntimeError, match="backward failed"):
        second(RaiseOnce.apply(first(x))).sum().backward()  # second's buckets go, then it fails
    assert reducer.launched  # the failed pass had sent some buckets
    bucketer.zero_grad()
    reducer.launched.clear()
    second(RaiseOnce.apply(first(x))).sum().backward()
    launched = sum(size for size, _ in reducer.launched)
    assert launched == sum(p.numel() for p in params) + len(params)  # gradients, used-flags
    assert reducer.launched[-1][1]  # the last bucket went once every gradient was computed


def test_only_a_parameter_nothing_reached_since_zero_grad_loses_its_gradient() -> None:
    """A second backward before the step, and a gradient set by hand, are gradients too: the
    used-flags were reset after each reduction and missed them, dropping real gradients."""
    import torch
    from torch import nn

    from tether.comm.fusion import GradientBucketer
    from tether.comm.reducer import PendingReduce

    class GroupOfOne:  # the mean of one rank is its own tensor
        def start(self, chunk, average: bool):
            return PendingReduce(tensor=chunk, wire=chunk, done=True)

    torch.manual_seed(0)
    a, b, never = nn.Linear(4, 1), nn.Linear(4, 1), nn.Linear(4, 1)
    bucketer = GradientBucketer(
        [*a.parameters(), *b.parameters(), *never.parameters()], GroupOfOne(), 1.0
    )
    x = torch.randn(3, 4)
    bucketer.zero_grad()
    a(x).sum().backward()  # one loss per head, added up before one step
    b(x).sum().backward()
    bucketer.finish()
    assert torch.equal(a.weight.grad, x.sum(0, keepdim=True))
    assert b.weight.grad is not None and never.weight.grad is None
    bucketer.zero_grad()
    a.weight.grad = torch.ones_like(a.weight)  # a gradient of the user's own
    b(x).sum().backward()
    bucketer.finish()
    assert torch.equal(a.weight.grad, torch.ones_like(a.weight))
    assert never.weight.grad is None
