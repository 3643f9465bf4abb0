"""A vLLM worker extension for tests/vllm (LLM(worker_extension_cls=
"wl_worker_ext.WeightliftTestExtension"), called through collective_rpc):
the three ways a loader's get_all_weights is called after the model's first
load, and a hash of every parameter to compare loads byte for byte.

    wl_param_hashes()                {name: sha256 of its bytes} of every parameter and buffer
    wl_reload(path)                  reload_weights to the checkpoint at `path` (RL weight sync)
    wl_filtered(path, module)        EPLB's redistribution (vLLM 0.34's reload_experts_from_disk):
                                     a fresh loader's get_all_weights from `path`, only the
                                     tensors of `module` kept, that module reloaded layerwise
"""
from __future__ import annotations

import copy
import hashlib


class WeightliftTestExtension:
    def wl_param_hashes(self) -> dict[str, str]:
        import torch

        model = self.model_runner.get_model()
        out = {}
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            data = t.detach().to("cpu").contiguous().reshape(-1)
            out[name] = hashlib.sha256(data.view(torch.uint8).numpy().tobytes()).hexdigest()
        return out

    def wl_reload(self, path: str) -> None:
        self.model_runner.reload_weights(weights_path=path, is_checkpoint_format=True)

    def wl_filtered(self, path: str, module: str) -> int:
        from vllm.model_executor.model_loader import get_model_loader
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

        model = self.model_runner.get_model()
        model_config = copy.copy(self.model_runner.model_config)
        model_config.model, model_config.model_weights, model_config.revision = path, "", None
        layer = model.get_submodule(module)
        loader = get_model_loader(self.vllm_config.load_config)
        all_weights = loader.get_all_weights(model_config, model)
        kept = []

        def filtered():
            for name, tensor in all_weights:
                if name.startswith(module + "."):
                    kept.append(name)
                    yield name, tensor

        initialize_layerwise_reload(layer)
        model.load_weights(filtered())
        finalize_layerwise_reload(layer, self.model_runner.model_config)
        return len(kept)
