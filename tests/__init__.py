"""rs_interp's tests, laid out as the package: tests/<package>/test_<module>.py tests rs_interp/<package>/<module>.py,
tests/test_<module>.py a top-level module, tests/integration/ the library as a whole (docs/project/testing.md).
The helpers (builders, finite_differences, hf_families, mutations) import as ``tests.<helper>`` from every folder."""
