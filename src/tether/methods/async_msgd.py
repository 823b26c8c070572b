"""async-msgd: async-sgd whose server keeps a velocity (momentum SGD on the server).

Server update on each arrival (SC17's Async MSGD baseline), torch's momentum SGD: the velocity
``b <- mu*b + g`` and ``w <- w - lr*b``, the same recursion as ``v <- mu*v - lr*g; w <- w + v``
with ``v = -lr*b`` at a constant rate. With a user's own optimizer it is async-sgd with that
optimizer.
"""

from __future__ import annotations

from tether.methods.async_sgd import AsyncSGD
from tether.methods.default_rates import own_batch_rate


class AsyncMSGD(AsyncSGD):
    """Default lr 0.01 (momentum 0.9 on stale gradients needs a small lr): fastest to 85% test
    accuracy on LeNet-5 / Fashion-MNIST, 4 workers, 21.3-22.3 s against 26.0-30.6 s at 0.005;
    0.002 and 0.02 did not reach it in 4 epochs (benchmarks/results/method_defaults_sweep.md).
    Beyond 4 workers the momentum is lowered to keep the effective step (0.8 on 8 workers:
    :func:`~tether.methods.default_rates.damped_step`).
    """

    name = "async-msgd"
    defaults = {**own_batch_rate(0.01, damped=True), "momentum": 0.9}  # damped from 0.9
    local_step_name = "sgd"
    settings = AsyncSGD.settings | {"momentum"}
