"""The SGLang launch flags a host's release accepts (typed from ``remote/sglang_flags.py``'s answer)
and a sweep's ``flag=value`` checked against them (pure).

A flag is named as ``ServerArgs`` names its field (``speculative_num_steps``) or as on the command
line (``--speculative-num-steps``, an alias such as ``--speculative-draft-model``). A name the
release lacks, a value its choices refuse or one its type cannot parse is one line naming what it
has; nothing is changed on any host.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from gpuops.errors import GpuopsError
from gpuops.frozen import frozen

SPECULATIVE_PREFIX = "speculative_"
_TRUE = ("1", "true", "on", "yes")
_FALSE = ("0", "false", "off", "no")


@frozen
class FlagSpec:
    """One flag as the release's parser registers it."""

    names: tuple[str, ...]          # "--speculative-draft-model-path", "--speculative-draft-model"
    dest: str                       # the ServerArgs field: speculative_draft_model_path
    kind: str                       # value | switch | list
    type: str                       # int | float | str | bool
    choices: tuple[str, ...] | None  # None: any value (or computed at start-up: the release decides)

    @property
    def flag(self) -> str:
        return self.names[0]


@frozen
class ReleaseFlags:
    """What one host's SGLang accepts, and whether its server runs speculative decoding now."""

    host: str
    version: str
    flags: Mapping[str, FlagSpec]   # every name and field to its flag
    speculative: bool = False
    unread: tuple[str, ...] = ()    # argument sources the host's python could not parse (a newer syntax)
    python: str = "?"
    speculative_flags: tuple[str, ...] = ()  # the --speculative-* flags its server was launched with

    @classmethod
    def from_answer(cls, host: str, answer: Mapping[str, object]) -> "ReleaseFlags":
        raw = answer.get("flags")
        if not answer.get("ok") or not isinstance(raw, dict):
            raise GpuopsError(f"tune: {host}: {str(answer.get('error') or 'no flags read')[:300]}")
        flags: dict[str, FlagSpec] = {}
        for record in raw.values():
            if not isinstance(record, dict):
                continue
            names = tuple(str(n) for n in record.get("names") or () if str(n).startswith("--"))
            if not names:
                continue
            choices = record.get("choices")
            spec = FlagSpec(names, str(record.get("dest") or names[0][2:].replace("-", "_")),
                            str(record.get("kind") or "value"), str(record.get("type") or "str"),
                            tuple(str(c) for c in choices) if isinstance(choices, list) else None)
            for name in names:
                flags[name] = spec
            flags.setdefault(spec.dest, spec)
        given_unread, given_launched = answer.get("unread"), answer.get("speculative_flags")
        unread = tuple(p for p in (given_unread if isinstance(given_unread, list) else ()) if isinstance(p, str))
        launched = tuple(f for f in (given_launched if isinstance(given_launched, list) else ())
                         if isinstance(f, str) and f.startswith("--speculative-") and f in flags)
        return cls(host, str(answer.get("version") or "?"), flags, bool(answer.get("speculative")), unread[:20],
                   str(answer.get("python") or "?"), launched)

    def find(self, name: str) -> FlagSpec:
        key = name if name.startswith("--") else name.replace("-", "_")
        spec = self.flags.get(key) or self.flags.get("--" + key.replace("_", "-"))
        if spec is None:
            known = sorted({s.dest for s in self.flags.values()})
            close = difflib.get_close_matches(key.lstrip("-").replace("-", "_"), known, n=3, cutoff=0.6)
            hint = f" (closest: {', '.join(close)})" if close else ""
            if self.unread:  # a flag may live in a source that python could not read
                hint += (f" (python {self.python} there could not parse {len(self.unread)} of its argument "
                         f"sources, e.g. {self.unread[0]}: set gpuops_python to the server's python)")
            raise GpuopsError(f"tune: {self.host}: SGLang {self.version} has no launch flag {name}{hint}; "
                              "nothing was changed")
        return spec

    def check(self, name: str, value: str) -> FlagSpec:
        """``name=value`` as this release's parser would take it, or one line saying why not."""
        spec = self.find(name)
        where = f"tune: {self.host}: SGLang {self.version}'s {spec.flag}"
        if spec.kind == "switch":
            if value.lower() not in _TRUE + _FALSE:
                raise GpuopsError(f"{where} is a switch: give true or false, not {value!r}; nothing was changed")
            return spec
        if spec.choices is not None and value not in spec.choices:
            raise GpuopsError(f"{where} takes {', '.join(spec.choices)}, not {value!r}; nothing was changed")
        try:
            {"int": int, "float": float}.get(spec.type, str)(value)
        except ValueError:
            raise GpuopsError(f"{where} takes an {spec.type}, not {value!r}; nothing was changed") from None
        return spec


def launch_words(spec: FlagSpec, value: str) -> list[str]:
    """The words a flag set to ``value`` adds to the launch (a switch set false adds none)."""
    if spec.kind == "switch":
        return [spec.flag] if value.lower() in _TRUE else []
    return [spec.flag, value]


def is_speculative(name: str) -> bool:
    return name.lstrip("-").replace("-", "_").startswith(SPECULATIVE_PREFIX)
