"""horizon.parallel: meshes, sharding rules and the shard_map'd CP / EP paths (docs/SPEC.md §2).

* `mesh`     — axes (data, fsdp, expert, context), presets, THE logical-axis rules table,
               `make_mesh`, `param_shardings`, `batch_sharding`, `shard_params`, `sharding_table`;
* `context`  — MLA context parallelism (latent all-gather, zigzag layout);
* `experts`  — expert parallelism (all-to-all dispatch/combine, capacity, MXFP8 payload);
* `packing`  — cost-balanced assignment of RL rollouts to DP ranks;
* `sharded`  — `configure` (the CP / EP paths from cfg.mesh), placement, the sampling cache layout,
               the sharded forward; the steps that use it: `train.lm`, `rl.algo.trainer`.

Importing `context` / `experts` (or `sharded`) registers the "context_parallel" attention and
"expert_parallel" MoE implementations with the model (`mla.ATTENTION_IMPLS`, `moe.MOE_IMPLS`).
"""
