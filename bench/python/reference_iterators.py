"""BENCHMARK ONLY: the code paths of vLLM's weight iterators
(vllm/model_executor/model_loader/weight_utils.py), reconstructed so that
bench_vllm.py can run them beside weightlift's in one run without vLLM
installed. They call the real `safetensors` (0.8) and `torch` exactly as the
reference does:

  safetensors_weights_iterator  lazy/None: safe_open(framework="pt") and
                                get_tensor per name of keys(); eager:
                                safetensors.torch.load(f.read()); prefetch: a
                                background pool reading each file in 16 MiB
                                blocks, then lazy
  multi_thread_safetensors_...  load_file per file on a 4-thread pool,
                                as_completed, popping each dict
  pt_weights_iterator           torch.load(weights_only=True) per file
  multi_thread_pt_weights_...   torch.load on a 4-thread pool, as_completed

Progress bars, logging and the expert filter (off here) are left out. Not
part of weightlift; do not import it from the package.
"""
from __future__ import annotations

import concurrent.futures
import os
import re
import threading

import torch
from safetensors import safe_open
from safetensors.torch import load, load_file


def _natural_key(path: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", os.path.basename(path))]


def _read_into_page_cache(path: str, block_size: int) -> None:
    with open(path, "rb") as f:
        while f.read(block_size):
            pass


def _start_prefetch(files, threads: int = 8, block_size: int = 16 << 20) -> None:
    def run():
        with concurrent.futures.ThreadPoolExecutor(max_workers=threads) as ex:
            list(ex.map(lambda p: _read_into_page_cache(p, block_size), files))

    threading.Thread(target=run, daemon=True).start()


def safetensors_weights_iterator(files, use_tqdm_on_load=False, strategy=None):
    files = sorted(files, key=_natural_key)
    if strategy == "prefetch":
        _start_prefetch(files)
    for path in files:
        if strategy == "eager":
            with open(path, "rb") as f:
                state = load(f.read())
            yield from state.items()
        else:
            with safe_open(path, framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)


def multi_thread_safetensors_weights_iterator(files, use_tqdm_on_load=False, max_workers=4):
    with concurrent.futures.ThreadPoolExecutor(max_workers=max_workers) as ex:
        pending = (ex.submit(load_file, p, device="cpu") for p in files)
        for fut in concurrent.futures.as_completed(pending):
            state = fut.result()
            del fut
            for key in list(state):
                yield key, state.pop(key)


def pt_weights_iterator(files, use_tqdm_on_load=False, map_location="cpu"):
    for path in files:
        state = torch.load(path, map_location=map_location, weights_only=True)
        yield from state.items()
        del state


def multi_thread_pt_weights_iterator(files, use_tqdm_on_load=False, map_location="cpu", max_workers=4):
    def one(path):
        return torch.load(path, map_location=map_location, weights_only=True)

    with concurrent.futures.ThreadPoolExecutor(max_workers=max_workers) as ex:
        futures = [ex.submit(one, p) for p in files]
        for fut in concurrent.futures.as_completed(futures):
            state = fut.result()
            yield from state.items()
            del state
