"""Views of a vector cut once per (plan, tensor object) and reused (tether.comm.collectives.views):
reused only for the same object with the same storage, per thread, and never keeping the tensor
alive."""

from __future__ import annotations

import gc
import threading
import weakref

import torch

from tether.comm.collectives import views
from tether.comm.collectives.plan import compile_plan
from tether.comm.collectives.ring import ring_all_reduce


def _cut(plan, flat: torch.Tensor) -> list:
    alias = flat.detach()
    return [views.round_tensors(rp, alias, i % 2) for i, rp in enumerate(plan)]


def test_views_are_reused_for_the_same_tensor_and_storage_only() -> None:
    plan = compile_plan(ring_all_reduce(2), 0, 100, 4, 1 << 20)
    flat, other = torch.zeros(100), torch.zeros(100)
    assert views.cached_views(plan, flat) is None
    cut = _cut(plan, flat)
    views.remember_views(plan, flat, cut)
    assert views.cached_views(plan, flat) is cut
    assert views.cached_views(plan, other) is None, "another tensor of the same size"
    assert views.cached_views(compile_plan(ring_all_reduce(2), 1, 100, 4, 1 << 20), flat) is None
    sends = cut[0][0]
    assert sends[0][0].data_ptr() == flat.data_ptr(), "rank 0 first sends chunk 0"
    flat.set_(torch.ones(100))  # same object, new storage: the old views would write elsewhere
    assert views.cached_views(plan, flat) is None


def test_views_do_not_outlive_their_tensor() -> None:
    plan = compile_plan(ring_all_reduce(2), 0, 100, 4, 1 << 20)
    flat = torch.zeros(100)
    views.remember_views(plan, flat, _cut(plan, flat))
    key, alive = id(flat), weakref.ref(flat)
    assert key in views._cache()
    del flat
    gc.collect()
    assert alive() is None, "cached views keep the tensor object alive"
    assert key not in views._cache()


def test_each_thread_has_its_own_views() -> None:
    plan = compile_plan(ring_all_reduce(2), 0, 100, 4, 1 << 20)
    flat = torch.zeros(100)
    views.remember_views(plan, flat, _cut(plan, flat))
    seen: list[object] = []
    thread = threading.Thread(target=lambda: seen.append(views.cached_views(plan, flat)))
    thread.start()
    thread.join()
    # another thread's scratch buffers are its own: it must cut its own views
    assert seen == [None]
    assert views.cached_views(plan, flat) is not None
