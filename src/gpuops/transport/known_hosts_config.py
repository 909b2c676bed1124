"""``UserKnownHostsFile`` from ~/.ssh/config, read as OpenSSH reads it.

paramiko hands the option over as raw text: several files separated by blanks, quotes kept when
there are several, ``~`` and ``%`` tokens unexpanded. OpenSSH splits the words (quotes group them)
and expands ``~`` and ``%d %u %i %h %p %r %n %%``; a file the user named must be the file gpuops
reads, or a host vouched for there would be refused (or one vouched for elsewhere accepted).
"""

from __future__ import annotations

import getpass
import os
import re
import shlex
from typing import Any


def user_known_hosts_files(value: str, ssh_config: dict[str, Any], alias: str) -> list[str]:
    """The files a ``UserKnownHostsFile`` value names, expanded, in order."""
    # paramiko strips the quotes of a value that is one quoted word, so `"a b"` arrives as `a b`:
    # a value that names an existing file as a whole is that one file.
    if os.path.isfile(os.path.expanduser(value)):
        words = [value]
    else:
        try:
            words = shlex.split(value)
        except ValueError:  # an unbalanced quote: OpenSSH refuses the line; the words are the best guess
            words = value.split()
    return [os.path.expanduser(_expand_tokens(word, ssh_config, alias)) for word in words]


def _expand_tokens(word: str, ssh_config: dict[str, Any], alias: str) -> str:
    values = {
        "%": "%",
        "d": os.path.expanduser("~"),
        "u": getpass.getuser(),
        "i": str(os.getuid()),
        "h": str(ssh_config.get("hostname") or alias),
        "p": str(ssh_config.get("port") or 22),
        "r": str(ssh_config.get("user") or getpass.getuser()),
        "n": alias,
    }
    return re.sub(r"%(.)", lambda m: values.get(m.group(1), m.group(0)), word)
