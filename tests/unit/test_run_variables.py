"""The numeric run variables (gpuops_lease, gpuops_keep_runs): values honoured, bad ones refused with
one line naming the variable, never a traceback and never a silent default."""

import pytest

from gpuops.apply.remote_exec import keep_runs
from gpuops.apply.txn import lease_seconds
from gpuops.errors import GpuopsError


def test_defaults_and_given_values():
    assert keep_runs({}) == 20 and keep_runs({"gpuops_keep_runs": "3"}) == 3
    assert lease_seconds({"gpuops_lease": "7.5"}) == 7.5


@pytest.mark.parametrize("call, variables, message", [
    (keep_runs, {"gpuops_keep_runs": "many"}, "gpuops_keep_runs must be a whole number, not 'many'"),
    (keep_runs, {"gpuops_keep_runs": 0}, "gpuops_keep_runs must be at least 1, not 0"),
    (lease_seconds, {"gpuops_lease": "soon"}, "gpuops_lease must be a number of seconds, not 'soon'"),
    (lease_seconds, {"gpuops_lease": 0.5}, "gpuops_lease must be at least 1 second, not 0.5"),
])
def test_bad_values_are_refused_naming_the_variable(call, variables, message):
    with pytest.raises(GpuopsError) as caught:
        call(variables)
    assert str(caught.value) == message
