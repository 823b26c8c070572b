"""Reference models: plain ``torch.nn.Module`` s behind a name registry.

``build_model("lenet5", (1, 28, 28), 10)`` builds a model; ``MODELS.names()`` lists them. Seeding
is the caller's job (``torch.manual_seed`` before building), so every worker of a run builds the
same initial parameters.
"""

from __future__ import annotations

from tether.models.base import MODELS, ModelBuilder, build_model, count_parameters

__all__ = ["MODELS", "ModelBuilder", "build_model", "count_parameters"]
