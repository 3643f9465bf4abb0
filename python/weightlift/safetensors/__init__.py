"""weightlift.safetensors: the `safetensors` package's API (release 0.8) over
weightlift's reader and writer. Change one import prefix:

    from safetensors import safe_open              ->  from weightlift.safetensors import safe_open
    from safetensors.torch import load_file, save  ->  from weightlift.safetensors.torch import load_file, save
    from safetensors.numpy import load, save       ->  from weightlift.safetensors.numpy import load, save

Same names, signatures, defaults, results and exception classes as
safetensors 0.8 (torch and numpy; not TensorFlow, Flax, MLX or Paddle). Where
they differ, weightlift/_st.py says so. SafetensorError's subclasses here are
also the standard exceptions weightlift raises (ValueError, CorruptDataError,
KeyError, OSError).
"""
from .._st import (  # noqa: F401
    SafeSlice,
    SafetensorCorruptError,
    SafetensorError,
    SafetensorKeyError,
    SafetensorOSError,
    SafetensorValueError,
    TensorSpec,
    __version__,
    _safe_open_handle,
    deserialize,
    safe_open,
    serialize,
    serialize_file,
)
