"""A scratch folder on the host that is gone afterwards (stdlib only, Python 3.8+)."""

import shutil
import tempfile


def in_temp_dir(prefix, work):
    """Run ``work(dir)`` in a fresh temp dir that is removed afterwards (nothing left on the host)."""
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        return work(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)
