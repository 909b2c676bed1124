"""An SGLang server's command line, read the one way gpuops reads it (stdlib only, Python 3.8+).

The one parser of SGLang argv, used on both sides: the client's facts (``facts/server_args.py``),
the lab's host descriptions (``lab/gpu_description.py``), the applicability check of a gate patch
(``plan/applicability.py``), host modules (``remote/ports.py``, bundled) and the lab's stand-in
server, which runs as a plain file and imports this module as its sibling (the lab copies it next
to the stand-in, ``lab/hosts.STANDIN_SIBLINGS``). The one reader it cannot serve is the gather's
``gpuops_flag`` sh function (``facts/python_select.py``): it finds the server's port before any
python is chosen for the host, so it stays awk; ``tests/unit/test_sglang_argv.py`` holds it to
these rules.

The rules (SGLang's argparse, as far as a reader without its parser can follow them):
  * a flag is a word that starts with ``--`` and is longer than ``--``; its name is what follows,
    dashes as underscores (``--tp-size`` -> ``tp_size``, SGLang's ``ServerArgs`` field names);
  * ``--name=value`` gives exactly ``value`` (even an empty one, or one starting with ``--``);
  * ``--name v1 v2 ...`` takes the words up to the next flag: none -> ``True`` (a switch), one ->
    the word, several -> the list (``--cuda-graph-bs 1 2 4``); a value such as ``-1`` is a value;
  * a flag given twice: the last one wins (argparse's ``store``);
  * words before the first flag are positionals (``sglang serve MODEL``).
Words are already split (``/proc/PID/cmdline``, a JSON list, or ``shlex.split`` of a line), so a
quoted value with spaces is one word.
"""

DEFAULT_PORT = 30000  # SGLang's ServerArgs.port: where a server given no --port listens

# typed field -> the flag names SGLang accepts for it (dashes as underscores), the field first
ALIASES = {
    "model_path": ("model_path", "model"),
    "tp_size": ("tp_size", "tp", "tensor_parallel_size"),
    "dp_size": ("dp_size", "dp", "data_parallel_size"),
    "ep_size": ("ep_size", "ep", "expert_parallel_size"),
    "pp_size": ("pp_size", "pp", "pipeline_parallel_size"),
}


def is_flag(word):
    return word.startswith("--") and len(word) > 2


def flag_name(flag):
    """``--tp-size`` or ``tp-size`` -> ``tp_size``."""
    return (flag[2:] if flag.startswith("--") else flag).replace("-", "_")


def launch_args(argv):
    """The words after ``-m sglang.launch_server``, ``sglang serve`` (the console script, or
    ``-m sglang.cli.main serve``) or ``.../launch_server.py``; None when ``argv`` is none of them."""
    for i, word in enumerate(argv):
        if word == "sglang.launch_server" and i > 0 and argv[i - 1] == "-m":
            return list(argv[i + 1:])
        if word == "serve" and i > 0 and (
            _is_sglang_script(argv[i - 1])
            or (argv[i - 1] in ("sglang.cli.main", "sglang.cli") and i > 1 and argv[i - 2] == "-m")
        ):
            return list(argv[i + 1:])
        if word.endswith("sglang/launch_server.py"):
            return list(argv[i + 1:])
    return None


def _is_sglang_script(word):
    return word == "sglang" or word.endswith("/sglang")


SHELLS = ("sh", "bash", "dash", "zsh", "ksh")


def is_server_argv(argv, scripts=()):
    """Does a process with this argv run an SGLang server? The one rule: inspect's gather applies it
    (in awk, ``gpuops_is_server`` in ``facts/python_select.py``, held to this function by
    ``tests/unit/test_server_detection.py``) and so does every service manager.

      * ``launch_args`` finds a launch anywhere in argv (``-m sglang.launch_server``, the ``sglang
        serve`` console script or ``-m sglang.cli.main serve``, a path ending in
        ``sglang/launch_server.py``), so a wrapper that keeps the command in its own argv counts
        too: a venv shim (``/venv/bin/python3 /venv/bin/sglang serve``), ``uv run ...``, ``env
        K=V ...``, ``numactl ... --``;
      * a shell given the command as text (``sh -c '... exec python3 -m sglang.launch_server ...'``):
        the words after its last ``exec``, by the rule above;
      * a word naming one of ``scripts`` (a path, or a name matched as the last part of a path):
        a launch script known to exec a server, before it has (gpuops' own ``sglang-launch.sh``).
    """
    argv = list(argv)
    if launch_args(argv) is not None:
        return True
    for i, word in enumerate(argv[1:], 1):
        if word == "-c" and argv[i - 1].rsplit("/", 1)[-1] in SHELLS and i + 1 < len(argv):
            words = argv[i + 1].split()
            if "exec" in words:
                after = words[len(words) - words[::-1].index("exec"):]
                if launch_args(after) is not None:
                    return True
    return any(word == script or word.endswith("/" + script) for word in argv for script in scripts)


def parse_flags(words):
    """``--tp 8 --trust-remote-code --cuda-graph-bs 1 2 4`` -> ({"tp": "8", "trust_remote_code":
    True, "cuda_graph_bs": ["1", "2", "4"]}, positionals). Values stay strings."""
    flags = {}
    positional = []
    current = None
    values = []

    def close():
        if current is not None:
            # a repeated flag keeps its first place and takes the last value
            flags[current] = True if not values else values[0] if len(values) == 1 else list(values)

    for word in words:
        if is_flag(word):
            close()
            name, eq, value = word[2:].partition("=")
            current = flag_name(name)
            values = [value] if eq else []
            if eq:
                close()
                current = None
        elif current is None:
            positional.append(word)
        else:
            values.append(word)
    close()
    return flags, positional


def flag_value(words, flag):
    """The value given to ``flag`` (``--port``) in ``words`` as a string: the last occurrence's,
    the first word of a list; None when absent or a bare switch."""
    value = parse_flags(words)[0].get(flag_name(flag))
    if isinstance(value, list):
        return value[0]
    return value if isinstance(value, str) else None


def first_of(flags, field):
    """The value of typed ``field`` (a key of ``ALIASES``) in parsed ``flags``, by any of its
    names (the field's own name first); None when none is given."""
    for name in ALIASES.get(field, (field,)):
        if name in flags:
            return flags[name]
    return None


def with_flag(words, flag, value):
    """``words`` with ``flag``'s value replaced by ``value`` where it is given (every occurrence,
    either form), else ``flag value`` appended."""
    out = list(words)
    found = False
    for i, word in enumerate(out):
        if word == flag and i + 1 < len(out) and not is_flag(out[i + 1]):
            out[i + 1] = str(value)
            found = True
        elif word.startswith(flag + "="):
            out[i] = "%s=%s" % (flag, value)
            found = True
    return out if found else out + [flag, str(value)]
