"""weightlift.safetensors: the `safetensors` package's API (release 0.9,
0.8's included) over weightlift's engine. Change one import prefix:

    from safetensors import safe_open              ->  from weightlift.safetensors import safe_open
    from safetensors.torch import load_file, save  ->  from weightlift.safetensors.torch import load_file, save
    from safetensors.numpy import load, save       ->  from weightlift.safetensors.numpy import load, save

Same names, signatures, defaults, results and exception classes as
safetensors 0.9.0rc1 (torch and numpy; not TensorFlow, Flax, MLX or Paddle),
its additions included: safe_open(...).prefetch() -> PrefetchLoader (to a
CUDA device on the engine's pinned staging ring), get_tensor_meta() ->
TensorMeta, the PySafeSlice and PrefetchPlan names. Where they differ,
weightlift/_st.py says so. SafetensorError's subclasses here are also the
standard exceptions weightlift raises (ValueError, CorruptDataError,
KeyError, OSError).
"""
from .._st import (  # noqa: F401
    PrefetchLoader,
    PrefetchPlan,
    PySafeSlice,
    SafeSlice,
    SafetensorCorruptError,
    SafetensorError,
    SafetensorKeyError,
    SafetensorOSError,
    SafetensorValueError,
    TensorMeta,
    TensorSpec,
    __version__,
    _safe_open_handle,
    deserialize,
    safe_open,
    serialize,
    serialize_file,
)
