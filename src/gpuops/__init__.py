"""gpuops: inspect, tune and benchmark GPU inference hosts that run SGLang, over SSH."""

import time as _time

__version__ = "0.1.0"
# When gpuops' first module was imported: where `--timings` ends "startup" and starts "imports".
FIRST_IMPORT_AT = _time.monotonic()
