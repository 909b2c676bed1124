"""The modes of a request to ``node_health`` (stdlib only, Python 3.8+).

The client (``apply/deployment_health.py``) and the host-side helper (``remote/node_health.py``)
name its checks by these. They live apart from the helper so that the client imports three
strings, not the helper and the HTTP client, process manager and server code it runs on the host.
"""

MODE_LEADER, MODE_WORKER, MODE_ANSWER = "leader_answer", "worker_node", "port_answer"
