"""The collector while a gpuops command loads its modules (src/gpuops/process_gc.py): off during the
load, what was loaded frozen after it, back on for the command's own work; untouched for a program
that uses gpuops as a library, and for a module already loaded."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator

import pytest

from gpuops import cli, process_gc

NOT_LOADED = "gpuops_test_module_never_imported"


@pytest.fixture
def command_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This (pytest) process as the gpuops command would be: the policy on, the collector on; the
    objects frozen by a test are handed back to the collector after it."""
    monkeypatch.setattr(process_gc, "_active", True)
    was_enabled = gc.isenabled()
    gc.enable()
    yield
    gc.unfreeze()
    if was_enabled:  # a test may turn it off (test_a_collector_turned_off_by_the_program_stays_off)
        gc.enable()
    else:
        gc.disable()


def test_the_load_runs_without_the_collector_and_what_it_made_is_frozen(command_process: None) -> None:
    frozen_before = gc.get_freeze_count()
    with process_gc.loading_modules(NOT_LOADED):
        during = gc.isenabled()
        loaded = [[index] for index in range(2000)]  # containers: the objects the collector tracks
    assert during is False
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen_before + len(loaded)


def test_the_collector_comes_back_when_the_load_fails(command_process: None) -> None:
    with pytest.raises(ImportError):
        with process_gc.loading_modules(NOT_LOADED):
            raise ImportError(NOT_LOADED)
    assert gc.isenabled()


def test_a_module_already_loaded_leaves_the_collector_be(command_process: None) -> None:
    # A long command connects again and again (tune): its garbage must stay collectable.
    assert "json" in sys.modules
    frozen_before = gc.get_freeze_count()
    with process_gc.loading_modules("json"):
        during = gc.isenabled()
        [[index] for index in range(2000)]
    assert during is True
    assert gc.get_freeze_count() == frozen_before


def test_a_collector_turned_off_by_the_program_stays_off(command_process: None) -> None:
    gc.disable()
    with process_gc.loading_modules(NOT_LOADED):
        pass
    assert not gc.isenabled()


def test_a_program_using_gpuops_as_a_library_keeps_its_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process_gc, "_active", False)
    frozen_before = gc.get_freeze_count()
    with process_gc.loading_modules(NOT_LOADED):
        during = gc.isenabled()
    assert during is gc.isenabled()
    assert gc.get_freeze_count() == frozen_before


def test_the_gpuops_command_loads_its_command_module_and_fabric_so() -> None:
    # The real command in a fresh interpreter: `gpuops apply --help` imports the apply command module
    # under the policy, and the transport's fabric import (prepare_ssh, before any SSH host connects)
    # is made under it too.
    code = ("import gc, sys\n"
            "from gpuops import cli, process_gc\n"
            "from gpuops.inventory.model import Host\n"
            "from gpuops.transport import parallel\n"
            "seen = []\n"
            "real = process_gc.loading_modules\n"
            "def spy(name):\n"
            "    seen.append((name, name in sys.modules))\n"
            "    return real(name)\n"
            "process_gc.loading_modules = spy\n"
            "try:\n"
            "    cli.main(['apply', '--help'])\n"
            "except SystemExit:\n"
            "    pass\n"
            "assert process_gc._active, 'cli.main did not turn the policy on'\n"
            "assert ('gpuops.commands.apply', False) in seen, seen\n"
            "assert 'fabric' not in sys.modules\n"
            "parallel.prepare_ssh([Host('h', '127.0.0.1', 22, 'root', None, 'ssh', ('all',))])\n"
            "assert ('fabric', False) in seen and 'fabric' in sys.modules, seen\n"
            "assert gc.isenabled() and gc.get_freeze_count() > 10000, gc.get_freeze_count()\n"
            "print('OK')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().endswith("OK"), done.stdout + done.stderr
    assert cli.COMMANDS["apply"][0].startswith("gpuops.commands.apply:")
