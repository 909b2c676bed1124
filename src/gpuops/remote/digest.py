"""sha256 of a file, the one copy for host helpers (stdlib only, Python 3.8+).

Journal entries record ``after_sha256`` of each changed file; the bench snapshot checks whether a
gate patch is still in place by the same digest, so both must compute it the same way.
"""

import hashlib


def sha256_file(path):
    """Hex sha256 of the file's bytes; None when it does not exist (other errors raise)."""
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except FileNotFoundError:
        return None
