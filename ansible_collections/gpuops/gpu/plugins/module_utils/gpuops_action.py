# Shared by the gpuops.gpu action plugins: the gpuops Host for a task, and a runner over Ansible's connection.
from __future__ import annotations


def host_and_runner(action, task_vars, own_connection=False):
    """The gpuops Host for this task's host, and a runner over Ansible's connection.

    own_connection (the role action): gpuops connects itself, from the host's ansible_* variables
    and the play's become settings.
    """
    from gpuops import ansible_bridge
    from gpuops.transport.connvars import IMPLEMENTED, IRRELEVANT

    name = task_vars["inventory_hostname"]
    templar = action._templar
    wanted = (IMPLEMENTED | IRRELEVANT) if own_connection else frozenset({"ansible_python_interpreter"})
    variables = {}
    for key, value in task_vars.items():
        if (key.startswith("ansible_") and key not in wanted) or key in ansible_bridge.MAGIC_VARS:
            continue
        try:
            variables[key] = templar.template(value)
        except Exception:  # a variable this task does not need and Ansible cannot template: leave it out
            continue
    context = action._play_context
    if own_connection and context.become:
        variables["ansible_become"] = True
        if context.become_user:
            variables["ansible_become_user"] = context.become_user
        if context.become_pass:
            variables["ansible_become_password"] = context.become_pass
    if own_connection and context.remote_addr and "ansible_host" not in variables:
        variables["ansible_host"] = context.remote_addr
    host = ansible_bridge.host_from_vars(name, variables, own_connection=own_connection)

    def runner(command, stdin):
        done = action._low_level_execute_command(command, in_data=stdin, sudoable=True)
        return (done.get("rc", 1), done.get("stdout", "").encode("utf-8", "surrogateescape"),
                done.get("stderr", "").encode("utf-8", "surrogateescape"))

    return host, runner
