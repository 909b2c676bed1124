"""SGLang releases as gpuops deploys them: a release's own wheel read on the operator's machine
(its pins from METADATA: ``wheel.py``; its server's flags from its own argument sources:
``flags.py``), the environment a host builds for it (``remote/release_env.py``)."""
