# Shared by the gpuops.gpu action plugins: the gpuops Host for a task, and a runner over Ansible's connection.
from __future__ import annotations


def host_and_runner(action, task_vars):
    from gpuops import ansible_bridge

    name = task_vars["inventory_hostname"]
    templar = action._templar
    variables = {}
    for key, value in task_vars.items():
        if (key.startswith("ansible_") and key != "ansible_python_interpreter") or key in ansible_bridge.MAGIC_VARS:
            continue
        try:
            variables[key] = templar.template(value)
        except Exception:  # a variable this task does not need and Ansible cannot template: leave it out
            continue
    host = ansible_bridge.host_from_vars(name, variables)

    def runner(command, stdin):
        done = action._low_level_execute_command(command, in_data=stdin, sudoable=True)
        return (done.get("rc", 1), done.get("stdout", "").encode("utf-8", "surrogateescape"),
                done.get("stderr", "").encode("utf-8", "surrogateescape"))

    return host, runner
