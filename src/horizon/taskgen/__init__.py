"""SWE-bench-format tasks generated from real repositories by validated bug injection
(docs/SPEC.md §5, §7), driven by envs/build_repo_images.py. The pipeline is in `generate`'s docstring.

- `repos`: the repository manifest, repository images and the screened test baseline
- `mutate`: AST bug injection (single-site kinds, feature deletions, combinations)
- `coverage`: which tests run which function (the traced suite run), and the tests a mutation reaches
- `pytest_coverage_plugin`: the pytest plugin copied into the containers (not imported here)
- `candidates`: the seeded choice of mutations to validate
- `verdicts`: the kept-iff rule and the per-candidate verdict cache
- `validation`: candidates run in Docker containers, a pool of workers
- `instances`: a kept candidate as a SWE-bench instance and its image
- `generate`: `GenOptions`, the per-repository driver `generate_repo`, and the reports

Nothing is imported here: import the module you need.
"""
