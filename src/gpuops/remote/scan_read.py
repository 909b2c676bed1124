"""Gate scan: reading one file of the tree, touching only what is meant to be read.

A tree on a host can hold anything under a ``.py`` name: a FIFO (an open for reading blocks until
a writer comes, for good), a link to ``/dev/zero`` (a read never ends), a sparse file of a
terabyte (one read asks for all of it). So a file is opened without blocking, read only when the
OPEN descriptor is a regular file (a name checked first could be swapped before the open), and
read up to a limit; anything else is one short reason, never a hang or a crash.

Symlinked files are followed, as the walk and the fingerprint's stat walk have always done (only
symlinked directories are not descended): the check is on what the link leads to.

Host code: stdlib only, Python 3.8+.
"""

import fcntl
import os
import stat

# What one scan reads at most, per file and in all: far above any real release, so that no real
# file is ever left out, and a bound on what a hostile tree can make the host read and hold.
# Measured (the scanner's own walk over the cached releases in ~/.cache/gpuops): the
# largest .py is 1,172,992 bytes (FlashInfer 0.7.1 experimental/cake_mxfp8_megamoe_ep16/kernels/
# fused_all_ctas.py; SGLang's largest, 0.5.16 srt/server_args.py, is 375,202); the most in one
# tree is 80,217,384 bytes (FlashInfer 0.7.1; SGLang 0.5.23: 60,380,473 in 4,016 files). 16 MiB a
# file is ~14x the largest (read_package_files in facts/software_remote.py uses the same); 512 MiB
# a scan is ~6.4x the largest tree.
FILE_BYTES_MAX = 16 << 20
SCAN_BYTES_MAX = 512 << 20


class NotRead(Exception):
    """Why a file was not read, in a few words (the scan lists it with this reason)."""


class TooLarge(NotRead):
    """The file holds more than the limit it was read with."""


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))

_CHUNK = 1 << 20


def _kind(mode):
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def _check(info, limit):
    if not stat.S_ISREG(info.st_mode):
        raise NotRead("not a regular file (%s)" % _kind(info.st_mode))
    if info.st_size > limit:
        raise TooLarge("too large (%d bytes; the limit is %d)" % (info.st_size, limit))


def _open_fd(path, limit):
    """A blocking descriptor of the regular file at ``path`` (links followed), checked on the
    descriptor itself; ``NotRead`` (``TooLarge``) otherwise."""
    try:
        # By name first, only so that a device is never even opened (opening some has effects:
        # a watchdog arms, a tape rewinds); the check that counts is on the descriptor below.
        _check(os.stat(path), limit)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise NotRead("cannot read: %s" % (exc.strerror or exc))
    try:
        _check(os.fstat(fd), limit)
        # A regular file it is: reads as usual from here (O_NONBLOCK was only for the open).
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except OSError as exc:
        os.close(fd)
        raise NotRead("cannot read: %s" % (exc.strerror or exc))
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(path, limit):
    """A binary file object of the regular file at ``path`` (links followed, no larger than
    ``limit`` when opened), for a reader that streams it; raises ``NotRead`` as ``read_regular``."""
    return os.fdopen(_open_fd(path, limit), "rb")


def read_regular(path, limit):
    """The bytes of the regular file at ``path`` (links followed), at most ``limit`` of them;
    raises ``NotRead`` (``TooLarge`` for a file over the limit) with the reason otherwise."""
    fd = _open_fd(path, limit)
    try:
        try:
            chunks = []
            got = 0
            while got <= limit:  # one byte past the limit tells a file that grew after the fstat
                chunk = os.read(fd, min(_CHUNK, limit + 1 - got))
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
        except OSError as exc:
            raise NotRead("cannot read: %s" % (exc.strerror or exc))
        if got > limit:
            raise TooLarge("too large (more than %d bytes, the limit)" % limit)
        return b"".join(chunks)
    finally:
        os.close(fd)
