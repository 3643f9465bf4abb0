"""Drop-in namespace for vLLM's weight utilities:

    # from vllm.model_executor.model_loader.weight_utils import safetensors_weights_iterator
    from weightlift.vllm_compat import safetensors_weights_iterator
"""
from .ep_weight_filter import (  # noqa: F401
    compute_eplb_local_expert_ids,
    compute_local_expert_ids,
    parse_expert_id,
    should_skip_weight,
)
from .weight_utils import *  # noqa: F401,F403
from ._hub import enable_xet_high_performance, maybe_download_from_modelscope  # noqa: F401
from ._gpu import fastsafetensors_weights_iterator, instanttensor_weights_iterator  # noqa: F401
from ._objstore import runai_safetensors_weights_iterator  # noqa: F401
from ._vllm_extras import (  # noqa: F401  (vLLM 0.32-0.34's names beyond the reference)
    DisabledTqdm,
    _local_snapshot_dirs,
    drop_checkpoint_cache,
    filter_mm_encoder_only_safetensors_files,
    filter_safetensors_files_by_weight_name,
    finalize_model_weights,
    resolve_mm_encoder_only_lm_prefixes,
)
from .weight_utils import (  # noqa: F401  (private helpers vLLM's own tests use)
    _BAR_FORMAT,
    _get_available_ram_bytes,
    _get_checkpoints_size_bytes,
    _get_fs_type,
    _natural_sort_key,
    _prefetch_all_checkpoints,
    _prefetch_checkpoint,
    _shared_pointers,
    _shuffle_files,
)
