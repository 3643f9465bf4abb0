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
