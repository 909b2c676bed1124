"""Throwaway simulated GPU hosts on loopback (``gpuops lab``), for users and for the test suite.

The API lives in ``gpuops.lab.hosts``: ``LabSpec``, ``start_lab(root, specs) -> Lab``,
``load_lab(root)``, ``stop_lab(root)``. It is not re-exported here so that importing
``gpuops.lab.sglang_cache`` stays cheap.
"""
