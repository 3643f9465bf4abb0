"""The Python faces keep the shared-cache rules (docs/integrity.md): vLLM's model
lock (weightlift.get_lock, filelock underneath) is never taken through a link
planted in a shared folder, so the file it points to is neither truncated nor
made world-writable; a lock file of ours is created with mode 0o666 and shared."""
import os
import stat

import filelock
import pytest

from weightlift._files import get_lock, model_lock_path


def test_a_planted_lock_link_is_refused_and_its_target_untouched(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    victim.chmod(0o600)
    locks = tmp_path / "locks"
    locks.mkdir()
    os.symlink(victim, model_lock_path("org/m", str(locks)))
    with pytest.raises(PermissionError, match="symbolic link"):
        with get_lock("org/m", str(locks)):
            pass
    assert victim.read_text() == "precious\n"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600


def test_a_lock_file_of_ours_is_shared_and_excludes(tmp_path):
    with get_lock("org/m", str(tmp_path)):
        path = model_lock_path("org/m", str(tmp_path))
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o666
        with pytest.raises(filelock.Timeout):  # another holder waits (flock is per open file)
            get_lock("org/m", str(tmp_path)).acquire(timeout=0.2)
    with get_lock("org/m", str(tmp_path)):  # released: taken again
        pass


def test_a_lock_path_that_is_a_folder_is_refused(tmp_path):
    os.mkdir(model_lock_path("org/m", str(tmp_path)))
    with pytest.raises(OSError):
        with get_lock("org/m", str(tmp_path)):
            pass
