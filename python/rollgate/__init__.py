"""rollgate: load the trainer bridge's batches for verl and talk to the gateway.

    tensors, non_tensors, meta_info = rollgate.load_batch("batch.safetensors")
    batch = DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta_info)

Standard library and numpy only; torch is imported lazily (tensors come back as
torch tensors when it is importable, numpy arrays otherwise), pyarrow only for
Parquet.
"""
from .batch import load_batch, pad_rows, read_safetensors
from .client import Gateway, GatewayError, Lease

__all__ = ["load_batch", "pad_rows", "read_safetensors", "Gateway", "GatewayError", "Lease"]
__version__ = "0.1.0"
