"""Speculative decoding as the running server does it (pure): in effect or not, with which
algorithm, steps, top-k and draft tokens, and whose word that is.

The server's own word comes first. SGLang resolves the speculative settings at start-up, so the
command line alone does not say what runs: with ``--speculative-num-steps`` unset it chooses steps,
top-k and draft tokens itself (``_auto_choose_speculative_params``: ``(3, 1, 4)`` for most models,
``(5, 4, 8)`` for Llama and Grok), with top-k 1 it sets the draft tokens to steps + 1, and it may
rename the algorithm (``NEXTN`` runs as ``EAGLE``) (0.5.23 ``srt/arg_groups/speculative_hook.py``).
Where the server reports its resolved settings (``/server_info``: ``facts/server_report.py``)
they decide and the reason says so, naming each launch flag that says otherwise and each setting
SGLang chose itself. Without a report (no server, a release that reports nothing, a report that
failed) the launch flags are the answer, and the reason says that SGLang may still change them.
"""

from __future__ import annotations

from dataclasses import field
from typing import Mapping, TypedDict
from gpuops.frozen import frozen

# Our name -> the server setting (and its launch flag: ``--`` + the setting with dashes).
SETTINGS = (("algorithm", "speculative_algorithm"), ("num_steps", "speculative_num_steps"),
            ("eagle_topk", "speculative_eagle_topk"), ("num_draft_tokens", "speculative_num_draft_tokens"),
            ("draft_model_path", "speculative_draft_model_path"))
_OFF = (None, False, "", "none", "None", "NONE")


class SpeculativeJSON(TypedDict):
    """``server.speculative_in_effect`` of the inspect document (``SpeculativeInEffect.to_json``)."""

    in_effect: bool | None
    settings: dict[str, object]
    source: str | None
    reason: str
    disagreements: list[str]


@frozen
class SpeculativeInEffect:
    """Whether the running server decodes speculatively, with which settings, and whose word that is (its
    resolved settings, else its launch flags)."""

    in_effect: bool | None                   # None: cannot tell (no server runs)
    settings: dict[str, object] = field(default_factory=dict)  # what runs: algorithm, num_steps, ...
    source: str | None = None                # the route that said it ("/server_info"), or "launch flags"
    reason: str = ""
    disagreements: tuple[str, ...] = ()      # launch flags the server's resolved settings overrule

    def to_json(self) -> SpeculativeJSON:
        return {"in_effect": self.in_effect, "settings": dict(self.settings), "source": self.source,
                "reason": self.reason, "disagreements": list(self.disagreements)}


def _flag(setting: str) -> str:
    return "--" + setting.replace("_", "-")


def _same(launched: object, resolved: object) -> bool:
    return str(launched).strip().lower() == str(resolved).strip().lower()


def _said(settings: Mapping[str, object]) -> str:
    algorithm = settings.get("algorithm")
    rest = [f"{label} {settings[key]}" for key, label in (("num_steps", "steps"), ("eagle_topk", "topk"),
                                                          ("num_draft_tokens", "draft tokens"))
            if settings.get(key) is not None]
    return f"{algorithm}" + (f" ({', '.join(rest)})" if rest else "")


def judge(launched: Mapping[str, object] | None, reported: Mapping[str, object] | None,
          running: bool) -> SpeculativeInEffect:
    """``launched``: the speculative launch flags (``server_args.ServerSettings.speculative``, None
    when ``--speculative-algorithm`` was not given); ``reported``: inspect's ``server.reported``
    (route, settings, error) or None."""
    if not running:
        return SpeculativeInEffect(None, reason="no SGLang server is running")
    given = dict(launched or {})
    settings = (reported or {}).get("settings") if not (reported or {}).get("error") else None
    if isinstance(settings, Mapping) and "speculative_algorithm" in settings:
        route = str((reported or {}).get("route") or "/server_info")
        resolved = {ours: settings.get(theirs) for ours, theirs in SETTINGS}
        on = resolved["algorithm"] not in _OFF
        if not on:
            resolved = {}
        where = f"in its resolved settings ({route})"
        if on:
            text = f"on: the server reports {_said(resolved)} {where}"
        else:
            text = f"off: the server reports speculative_algorithm={settings.get('speculative_algorithm')!r} {where}"
        differ = []
        chosen = []
        for ours, theirs in SETTINGS:
            asked, runs = given.get(ours), resolved.get(ours)
            if asked is not None and not _same(asked, runs):
                differ.append(f"launched with {_flag(theirs)} {asked}, the server runs {runs if runs is not None else 'none'}")
            elif asked is None and runs is not None and on and ours != "algorithm":
                chosen.append(f"{ours} {runs}")
        if on and not given:
            differ.insert(0, "not launched with --speculative-algorithm")
        if chosen:
            text += f"; SGLang chose {', '.join(chosen)} itself (not on the command line)"
        if differ:
            text += "; the server's word is taken over the launch flags: " + "; ".join(differ)
        elif given or not on:
            text += "; the launch flags agree"
        return SpeculativeInEffect(on, {k: v for k, v in resolved.items() if v is not None}, route, text,
                                   tuple(differ))
    error = (reported or {}).get("error")
    why = f"the server's own report is unavailable: {error}" if error else "the server reports no resolved settings"
    if not given:
        return SpeculativeInEffect(False, {}, "launch flags", f"off: not launched with --speculative-algorithm ({why})")
    kept = {k: v for k, v in given.items() if v is not None}
    unset = [ours for ours, _ in SETTINGS[1:4] if given.get(ours) is None]
    text = f"on: launched with --speculative-algorithm {_said(kept)} ({why})"
    if unset:
        text += f"; SGLang chooses {', '.join(unset)} at start-up, not known here"
    return SpeculativeInEffect(True, kept, "launch flags", text)
