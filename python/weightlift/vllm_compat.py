"""Drop-in for vLLM's weight_utils module:

    # from vllm.model_executor.model_loader.weight_utils import safetensors_weights_iterator
    from weightlift.vllm_compat import safetensors_weights_iterator

It is weightlift.weight_utils itself under vLLM's role (`weightlift.vllm_compat
is weightlift.weight_utils`): vLLM's module is one namespace whose functions
read its globals at call time, and vLLM's own tests patch them there
(get_tensor_model_parallel_rank, get_world_group, _get_fs_type, ...); a copy
of the names would take the patch without the functions seeing it.
"""
import sys

from . import weight_utils

sys.modules[__name__] = weight_utils
