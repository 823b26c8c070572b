"""Data sets and sharding: IDX (MNIST, Fashion-MNIST), CIFAR-10 binary, sklearn digits, synthetic.

Real data are read from standard files and never downloaded at run time.
"""

from tether.data.dataset import ArrayDataset
from tether.data.idx import read_idx
from tether.data.registry import DATASETS, check_dataset, fill_dataset_cache, load_dataset
from tether.data.sharding import GlobalBatchSampler, shard_range

__all__ = [
    "DATASETS",
    "ArrayDataset",
    "GlobalBatchSampler",
    "check_dataset",
    "fill_dataset_cache",
    "load_dataset",
    "read_idx",
    "shard_range",
]
