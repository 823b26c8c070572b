"""Mixed precision: the compute dtype of forward and backward, and fp16's loss scaling.

``precision="bf16"`` or ``"fp16"`` runs forward and backward under ``torch.autocast`` on the
worker's device (CPU or CUDA) while the weights, the optimizer's state and the update stay in
fp32 (Micikevicius et al. 2018, "Mixed precision training"; Jia et al. 2018 train ResNet-50 this
way at a 64k batch). Every message a method sends stays fp32 too, unless the user chose a wire
format (``compress``). fp16 also scales the loss (:class:`LossScaler`), since its small range
would flush small gradients to zero.
"""

from tether.precision.policy import PRECISIONS, Precision
from tether.precision.scaler import LossScaler, ScalerSettings

__all__ = ["PRECISIONS", "LossScaler", "Precision", "ScalerSettings"]
