"""One progress bar like vLLM's: its iterators wrap tqdm around the list of
files, which prints a line at the start, one per finished file and one when
it closes; ours print exactly as many (they printed 6 for 2 files)."""
import time

import torch
from safetensors.torch import save_file
from tqdm import tqdm

import weightlift.weight_utils as wu


def _lines(err: str) -> list[str]:
    return [line for line in err.replace("\r", "\n").splitlines() if "Completed |" in line]


def test_bar_prints_the_lines_vllms_tqdm_over_files_prints(tmp_path, capsys):
    files = []
    for i in range(3):
        files.append(str(tmp_path / f"model-0000{i + 1}-of-00003.safetensors"))
        save_file({f"w{i}.a": torch.zeros(2), f"w{i}.b": torch.ones(2)}, files[-1])
    # vLLM's loop, consumed slowly enough that tqdm's 0.1 s rate limit never hides a line.
    for _ in tqdm(files, desc="Loading safetensors checkpoint shards", bar_format=wu._BAR_FORMAT):
        time.sleep(0.12)
    theirs = _lines(capsys.readouterr().err)
    seen = set()
    for name, _ in wu.safetensors_weights_iterator(files, True):
        if name[:2] not in seen:
            seen.add(name[:2])
            time.sleep(0.12)
    ours = _lines(capsys.readouterr().err)
    assert len(theirs) == len(files) + 2
    assert [line.split(" [")[0] for line in ours] == [line.split(" [")[0] for line in theirs]


def test_the_vllm_plugins_bar_is_the_same_bar(capsys):
    """The plug-in's bar (files finished as their last tensor reaches the model, whichever
    pass delivered it) prints what vLLM's tqdm over files prints."""
    from weightlift.vllm_plugin._progress import FileBar

    files = ["a.safetensors", "b.safetensors", "c.safetensors", "d.safetensors"]
    file_of = {"a1": "a.safetensors", "a2": "a.safetensors", "b1": "b.safetensors", "c1": "c.safetensors",
               "d1": "d.safetensors"}
    bar = FileBar(files, file_of, True)
    for names in (["a1"], ["b1"], ["a2"], ["c1"], ["d1"]):
        time.sleep(0.12)
        bar.done_tensors(names)
    bar.close()
    lines = [line.split(" [")[0] for line in _lines(capsys.readouterr().err)]
    assert lines == ["Loading safetensors checkpoint shards:   0% Completed | 0/4",
                     "Loading safetensors checkpoint shards:  25% Completed | 1/4",
                     "Loading safetensors checkpoint shards:  50% Completed | 2/4",
                     "Loading safetensors checkpoint shards:  75% Completed | 3/4",
                     "Loading safetensors checkpoint shards: 100% Completed | 4/4",
                     "Loading safetensors checkpoint shards: 100% Completed | 4/4"]
    quiet = FileBar(files, file_of, False)
    quiet.done_tensors(list(file_of))
    quiet.close()
    assert capsys.readouterr().err == ""
