from pathlib import Path

# The curated catalog that ships with gpuops (read by gates/catalog.py; its patch keywords are kept
# by gates/probe.py). Named here so that a path to it costs no import of the catalog's code.
BUILTIN_CATALOG = Path(__file__).with_name("catalog.yaml")
