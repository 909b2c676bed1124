"""Stdlib-only host code: modules that run on hosts with the host's own python (3.8+).

Nothing here is installed on a host, and nothing here runs only on the client: a helper and the host
modules it imports (``from gpuops.remote import x``, absolute imports) are bundled into one script
and shipped on stdin by ``gpuops.shipping`` (the client's side). A module here imports only the
standard library and ``gpuops.remote`` (tests/unit/test_remote_bundle.py); the client imports some of
them too (``host_protocol``, ``apply_journal``, ``secret_mask``, ...): one copy for both sides.
"""
