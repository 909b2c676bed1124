"""The release strategy: a plan that changes the SGLang release (sglang-release) prepares the new
environment before the pipeline's transaction: the environment built (or found) or the image pulled
(or found) and checked, the gate audit of the new tree against the running one, each standing source
patch judged on it; a refusal stops nothing. With ``sglang_release_stage`` the run ends there. It is
chosen for every host: a plan that carries no release leaves it with nothing to do."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from gpuops.apply.host_report import HostReport
from gpuops.apply.pipeline import HostRun, Refusal, RunEnds, Strategy
from gpuops.apply.release_env import EnvRefused
from gpuops.remote.host_protocol import STATUS_STAGED

if TYPE_CHECKING:
    from gpuops.inventory import Host
    from gpuops.plan.changes import ReleaseEnv, ReleaseImage
    from gpuops.transport import Connection


class ReleasePrep(Strategy):
    def checked(self, run: HostRun) -> None:
        if run.plan.release is not None:
            _release_check(run.conn, run.host, run.plan.release, run.report, run.variables,
                           offer_kept=not run.options.flush_cache)

    def prepare(self, run: HostRun) -> None:
        release = run.plan.release
        if release is None:
            return
        try:
            run.report.notes.extend(_release_ready(run.conn, run.host, release, run.variables,
                                                   offer_kept=not run.options.flush_cache))
        except EnvRefused as exc:
            raise Refusal(str(exc), journaled=True) from None
        if run.plan.entrypoints_unread:  # the environment is there now: its release says how to launch it
            _with_entrypoints(run)
            run.report.changes = [c.summary() for c in run.plan.changes]
            run.report.changed = run.plan.changed + int(run.plan.starts)
        if run.plan.release is not None and run.plan.release.stage:  # the fleet is prepared; the switch is a later run
            report = run.report
            report.status, report.changed, report.run_id = STATUS_STAGED, 0, run.run_id
            report.notes.append("staged: the release is ready on the host and nothing was switched; apply again "
                                "without sglang_release_stage to switch")
            raise RunEnds


def _with_entrypoints(run: HostRun) -> None:
    """The facts with the entrypoints of the launch pythons the gather could not read (a release
    environment built since), and the plan made again from them (one more exec, only then)."""
    import dataclasses

    from gpuops.apply.probes import entrypoints_probe
    from gpuops.facts.python_select import preamble_for_vars
    from gpuops.gather import ProbeFailure, gather

    # Such a python is a release environment's (sglang-release's part of the launch): its launch
    # sets PYTHONPATH empty (plan/release.py), so it is asked without the gather's.
    read = gather(run.conn, [entrypoints_probe(run.plan.entrypoints_unread, None, isolated=True)],
                  preamble=preamble_for_vars(run.variables))["apply.entrypoints"]
    if isinstance(read, ProbeFailure) or not read:
        return
    run.facts = dataclasses.replace(run.facts, entrypoints={**dict(run.facts.entrypoints or {}), **read})
    run.plan = run.replan()


def _release_ready(conn: "Connection", host: "Host", release: "ReleaseEnv | ReleaseImage",
                   variables: Mapping[str, Any], offer_kept: bool) -> list[str]:
    """sglang-release before anything stops: the environment built (or found) or the image pulled
    (or found) and checked, then the gate audit of the new tree against the running one, and each
    standing source patch judged on the new tree. Raises ``EnvRefused`` (nothing changed)."""
    from gpuops.apply.release_env import EnvRefused
    from gpuops.plan.release import ReleaseImage

    if isinstance(release, ReleaseImage):
        from gpuops.apply import release_image

        ready_image = release_image.make_ready(conn, release, host.name)
        assert ready_image is not None
        notes = [ready_image.note(release.version)]
    else:
        from gpuops.apply.release_env import make_ready

        notes = [make_ready(conn, release, host.name, variables.get("gpuops_python")).note(release.version)]
    audit_notes, refusal = _release_audit(conn, host, release, offer_kept)
    if refusal is not None:
        raise EnvRefused(f"{host.name}: {refusal}")
    return notes + audit_notes


def _release_audit(conn: "Connection", host: "Host", release: "ReleaseEnv | ReleaseImage",
                   offer_kept: bool) -> tuple[list[str], str | None]:
    """The gate audit notes of the new tree (environment or image), and a standing patch's refusal.
    ``offer_kept=False`` (``--flush-cache``): the host's kept scans are not offered."""
    from gpuops.apply import release_audit
    from gpuops.plan.release import ReleaseImage

    image = release.tag if isinstance(release, ReleaseImage) else None
    old, new = release_audit.audits(conn, host, None if isinstance(release, ReleaseImage) else release.python, image,
                                      offer_kept)
    patch_notes, refusal = release_audit.judge_patches(release.patches, old, new, release.version)
    return release_audit.notes(old, new) + patch_notes, refusal


def _release_check(conn: "Connection", host: "Host", release: "ReleaseEnv | ReleaseImage", report: HostReport,
                   variables: Mapping[str, Any], offer_kept: bool) -> None:
    """``--check`` of sglang-release: builds and pulls nothing; where the host already holds the
    finished environment (an earlier run built it) or the image, its gate audit against the running
    tree is shown."""
    from gpuops.apply.release_env import EnvRefused, find_ready
    from gpuops.plan.release import ReleaseImage

    image = release if isinstance(release, ReleaseImage) else None
    try:
        if isinstance(release, ReleaseImage):
            from gpuops.apply import release_image

            found = release_image.make_ready(conn, release, host.name, pull_missing=False)
            note = found.note(release.version) if found is not None else None
        else:
            ready = find_ready(conn, release, host.name, variables.get("gpuops_python"))
            note = ready.note(release.version) if ready is not None else None
    except EnvRefused as exc:
        report.warnings.append(str(exc))
        return
    if note is None:
        what = f"the image {image.tag} is not on the host yet: apply pulls it" if image is not None else \
            "the environment is not on the host yet: apply builds it"
        report.notes.append(f"{what} before the server stops, then shows the gate audit of the new tree (what SGLang "
                            f"{release.version} opens and closes here) before the switch")
        return
    report.notes.append(note)
    audit_notes, refusal = _release_audit(conn, host, release, offer_kept)
    report.notes.extend(audit_notes)
    if refusal is not None:
        report.warnings.append(f"apply would refuse: {refusal}")
