"""weightlift: load large-model weights fast, with vLLM's weight-utility API.

    from weightlift import safetensors_weights_iterator   # vLLM's names and arguments
    from weightlift import safe_open, load_file, save_file  # safetensors' names and arguments
    from weightlift import stream_weights                   # our streaming iterator
    from weightlift import load_into                        # straight into your tensors

Errors: FileNotFoundError (missing file or tensor file), ValueError (bad
argument; CorruptDataError, a ValueError, for a file that violates its
format), PermissionError, OSError (I/O), NotImplementedError (a format this
build cannot read), each carrying the engine's message naming the file and tensor.
"""
from ._engine import CancelledError, CorruptDataError  # noqa: F401
from ._st import SafeSlice, safe_open  # noqa: F401
from .safetensors.torch import load_file, save_file  # noqa: F401
from .ep_weight_filter import compute_local_expert_ids, parse_expert_id, should_skip_weight  # noqa: F401
from .weight_utils import (  # noqa: F401
    atomic_writer,
    composed_weight_loader,
    convert_bin_to_safetensor_file,
    convert_pyslice_to_tensor,
    default_weight_loader,
    get_quant_config,
    get_sparse_attention_config,
    download_safetensors_index_file_from_hf,
    download_weights_from_hf,
    enable_tqdm,
    filter_duplicate_safetensors_files,
    filter_files_not_needed_for_inference,
    get_lock,
    initialize_dummy_weights,
    initialize_single_dummy_weight,
    maybe_remap_kv_scale_name,
    maybe_remap_moe_expert_param_name,
    multi_thread_pt_weights_iterator,
    multi_thread_safetensors_weights_iterator,
    np_cache_weights_iterator,
    pt_weights_iterator,
    remap_moe_expert_weights,
    row_parallel_weight_loader,
    safetensors_weights_iterator,
    sharded_weight_loader,
    stream_weights,
)
from ._engine import find_weight_files, peak_rss_bytes  # noqa: F401
from ._hub import (  # noqa: F401
    enable_xet_high_performance,
    hub_source,
    hub_weights_iterator,
    maybe_download_from_modelscope,
)
from ._gpu import fastsafetensors_weights_iterator, instanttensor_weights_iterator  # noqa: F401
from ._distributed import load_distributed  # noqa: F401
from .load_into import load_into  # noqa: F401
from ._objstore import runai_safetensors_weights_iterator  # noqa: F401

__version__ = "0.1.0"
